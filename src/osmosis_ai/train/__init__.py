"""The trainer: rollouts' gateway call records become masked sequences and GRPO updates.

Its parts, by role: ``algorithm/`` (sequences, advantages, micro-batches, logprobs, the loss,
the update, the schedule; ``grpo`` gathers the update's names), ``loop/`` (``osmosis train
run``: rows, rollouts, the producer, queue, staleness bound and consumer of asynchronous
training, one step), ``learner/`` (the model being trained, checkpoints, export),
``generation/`` (the engine that generates rollouts, the weight probe), ``bookkeeping/``
(journal, trackers), ``engines/`` (SkyRL and verl), and ``config`` and ``model`` (the model
source). ``algorithm.sequences`` and ``algorithm.advantages`` are pure Python; the rest of the
update needs torch (``pip install 'osmosis-ai[train]'``) and is imported from its modules, so
importing this package loads no torch.
"""

from osmosis_ai.train.algorithm import sequences
from osmosis_ai.train.algorithm.sequences import DriftPolicy as DriftPolicy
from osmosis_ai.train.algorithm.sequences import Exclusion as Exclusion
from osmosis_ai.train.algorithm.sequences import GrammarSpan as GrammarSpan
from osmosis_ai.train.algorithm.sequences import RolloutRecords as RolloutRecords
from osmosis_ai.train.algorithm.sequences import SequenceStats as SequenceStats
from osmosis_ai.train.algorithm.sequences import TrainingSequence as TrainingSequence
from osmosis_ai.train.algorithm.sequences import TruncationSpan as TruncationSpan
from osmosis_ai.train.algorithm.sequences import build_sequences as build_sequences

# The package exports what `sequences` exports (one list to keep); the redundant aliases
# above are what tells type checkers and linters that the names are re-exported.
__all__ = list(sequences.__all__)
