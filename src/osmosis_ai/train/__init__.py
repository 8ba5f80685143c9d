"""The trainer: rollouts' gateway call records become masked sequences and GRPO updates.

``osmosis_ai.train.sequences`` is pure Python; ``grpo`` and ``schedule`` need torch
(``pip install 'osmosis-ai[train]'``) and are imported from their modules, so importing this
package loads no torch.
"""

from osmosis_ai.train.sequences import (
    DriftPolicy,
    Exclusion,
    GrammarSpan,
    RolloutRecords,
    SequenceStats,
    TrainingSequence,
    build_sequences,
)

__all__ = [
    "DriftPolicy",
    "Exclusion",
    "GrammarSpan",
    "RolloutRecords",
    "SequenceStats",
    "TrainingSequence",
    "build_sequences",
]
