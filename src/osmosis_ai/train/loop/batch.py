"""A step's batch: its rollouts' training sequences, shaped and filtered, with their
advantages, each computed once (pure: no torch, no I/O).

The order is DAPO's: groups that carry no gradient are found on the grader's rewards, then
rewards are shaped (``[algorithm.overlong] mode = "penalty"``), then the advantages are taken
over the groups that train. The native loop builds one per sampling attempt; the last is the
step's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from osmosis_ai.train.algorithm.advantages import (
    overlong_shaped,
    step_advantages,
    zero_gradient_groups,
)
from osmosis_ai.train.algorithm.distill import distill_advantages
from osmosis_ai.train.algorithm.sequences import (
    RolloutRecords,
    SequenceStats,
    TrainingSequence,
    build_sequences,
)
from osmosis_ai.train.algorithm.settings import DistillConfig, UpdateSettings

__all__ = ["StepBatch", "distilled", "prepare_batch", "zero_gradient_then_shaped"]


@dataclass(frozen=True)
class StepBatch:
    """What a step trains on, and what it left out."""

    sequences: list[TrainingSequence]
    """Every sequence of the step's rollouts, rewards shaped (what ``record_sequences``
    writes)."""
    stats: SequenceStats
    zero_gradient: set[str]
    """Groups whose rewards were all equal: no gradient, left out of ``trained``."""
    trained: list[TrainingSequence]
    advantages: list[float | tuple[float, ...]]
    """``trained``'s advantages (`step_advantages`), in order."""

    @property
    def versions(self) -> list[int]:
        """The weight versions that generated ``trained``'s tokens (the staleness bound's)."""
        return [version for sequence in self.trained for version in sequence.versions]

    def dropped_tokens(self) -> int:
        """Policy tokens of the zero-gradient groups (a resampled attempt's, spent)."""
        return sum(s.policy_tokens for s in self.sequences if s.group_id in self.zero_gradient)


def distilled(
    batch: StepBatch, teacher: list[tuple[float, ...]], distill: DistillConfig
) -> StepBatch:
    """``batch`` with on-policy distillation's advantages (`distill_advantages`), given the
    teacher's logprobs of each token of ``batch.trained``."""
    advantages = distill_advantages(
        batch.trained,
        batch.advantages,
        teacher,
        weight=distill.weight,
        reward_weight=distill.reward_weight,
    )
    return dataclasses.replace(batch, advantages=list(advantages))


def prepare_batch(done: list[RolloutRecords], update: UpdateSettings) -> StepBatch:
    """The batch of the finished rollouts ``done`` under ``update``'s settings."""
    sequences, stats = build_sequences(done, drift="fork")
    shaped, zero = zero_gradient_then_shaped(sequences, update)
    trained = [s for s in shaped if s.group_id not in zero]
    return StepBatch(shaped, stats, zero, trained, step_advantages(trained, update.algorithm))


def zero_gradient_then_shaped(
    sequences: list[TrainingSequence], update: UpdateSettings
) -> tuple[list[TrainingSequence], set[str]]:
    """``sequences`` with their rewards shaped by the overlong penalty, and the groups that
    carry no gradient, found on the grader's rewards before the shaping (DAPO filters groups
    on accuracy, then shapes): shaped first, a group of equally right answers of other
    lengths would be kept, and the std scaling would turn their gaps of a few hundredths into
    advantages of ±1.5."""
    algorithm = update.algorithm
    credit = algorithm.turn_credit
    zero = zero_gradient_groups(sequences, credit.discount if credit is not None else None)
    if algorithm.distill is not None and algorithm.distill.weight > 0:
        zero = set()  # the teacher gives every sampled token a gradient, equal rewards or not
    overlong = algorithm.overlong
    if overlong is not None and overlong.mode == "penalty":
        sequences = overlong_shaped(sequences, update.max_tokens, overlong.buffer)
    return sequences, zero
