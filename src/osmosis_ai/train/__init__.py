"""The trainer: rollouts' gateway call records become masked sequences and GRPO updates.

``osmosis_ai.train.sequences`` and ``advantages`` are pure Python; the update's other
modules (``micro_batches``, ``logprobs``, ``loss``, ``update``, gathered in ``grpo``) and
``schedule`` need torch (``pip install 'osmosis-ai[train]'``) and are imported from their
modules, so importing this package loads no torch.
"""

from osmosis_ai.train import sequences
from osmosis_ai.train.sequences import DriftPolicy as DriftPolicy
from osmosis_ai.train.sequences import Exclusion as Exclusion
from osmosis_ai.train.sequences import GrammarSpan as GrammarSpan
from osmosis_ai.train.sequences import RolloutRecords as RolloutRecords
from osmosis_ai.train.sequences import SequenceStats as SequenceStats
from osmosis_ai.train.sequences import TrainingSequence as TrainingSequence
from osmosis_ai.train.sequences import build_sequences as build_sequences

# The package exports what `sequences` exports (one list to keep); the redundant aliases
# above are what tells type checkers and linters that the names are re-exported.
__all__ = list(sequences.__all__)
