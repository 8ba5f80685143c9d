"""How much each sequence counts in a step's loss: group advantages and per-token weights.

- ``group_advantages``: ``(r - mean) / (std + eps)`` within each group of rollouts of one
  dataset row, or ``r - mean`` (``scale="none"``, Dr. GRPO); against the mean of the
  others with ``baseline="rloo"``. ``zero_gradient_groups`` names
  the groups whose rewards are all equal: they carry no gradient.
- ``token_weights``: how the loss averages tokens, over the step's tokens or per rollout.

Pure Python (no torch): the runner picks the groups to run again before any update.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Literal

from osmosis_ai.train.algorithm.sequences import TrainingSequence

__all__ = ["group_advantages", "token_weights", "zero_gradient_groups"]


def _group_rewards(sequences: Iterable[TrainingSequence]) -> dict[str, dict[str, float]]:
    """group id -> rollout id -> reward (a rollout's forked sequences count once)."""
    groups: dict[str, dict[str, float]] = defaultdict(dict)
    for sequence in sequences:
        groups[sequence.group_id][sequence.rollout_id] = sequence.reward
    return groups


def zero_gradient_groups(sequences: Iterable[TrainingSequence]) -> set[str]:
    """Groups whose rollouts all have the same reward (a single rollout included).

    Their advantages are all 0, so they add no gradient: a runner skips or resamples them.
    """
    return {
        group
        for group, rewards in _group_rewards(sequences).items()
        if len(set(rewards.values())) == 1
    }


def group_advantages(
    sequences: Sequence[TrainingSequence],
    *,
    baseline: Literal["grpo", "rloo"] = "grpo",
    scale: Literal["std", "none"] = "std",
    eps: float = 1e-4,
) -> list[float]:
    """The advantage of each sequence: its rollout's reward against a baseline from its group.

    ``baseline="grpo"`` compares with the group's mean; ``"rloo"`` with the mean of the
    group's *other* rewards (REINFORCE leave-one-out, Ahmadian et al. 2024), an unbiased
    baseline since it does not depend on the rollout itself: ``r - mean_others``, which is
    ``G / (G - 1)`` times ``r - mean``. ``scale="std"`` then divides by the group's sample
    standard deviation plus ``eps`` (Bessel-corrected, as TRL's GRPO); ``"none"`` does not
    (Dr. GRPO). Each rollout counts once however many sequences it forked into; zero-gradient
    groups get 0.
    """
    by_group: dict[str, dict[str, float]] = {}
    for group, rewards in _group_rewards(sequences).items():
        values = list(rewards.values())
        if len(set(values)) == 1:
            by_group[group] = dict.fromkeys(rewards, 0.0)
            continue
        mean = statistics.fmean(values)
        # Leave-one-out: r - (sum - r) / (G - 1) = (r - mean) * G / (G - 1); G >= 2 here.
        spread = len(values) / (len(values) - 1) if baseline == "rloo" else 1.0
        divisor = statistics.stdev(values) + eps if scale == "std" else 1.0
        by_group[group] = {rollout: (r - mean) * spread / divisor for rollout, r in rewards.items()}
    return [by_group[s.group_id][s.rollout_id] for s in sequences]


def token_weights(
    sequences: Sequence[TrainingSequence], normalisation: Literal["token", "sequence"]
) -> list[float]:
    """The weight of one policy token of each sequence, so the step's loss is a weighted sum.

    ``"token"``: 1 / (policy tokens of the whole step), every token counts the same (DAPO).
    ``"sequence"``: 1 / (the rollout's policy tokens × rollouts), every rollout counts the
    same (GRPO), once however many sequences a fork split it into: its tokens are averaged
    over all its pieces. Computed over the whole step, so micro-batches add up to the
    full-batch loss.
    """
    counts = [sequence.policy_tokens for sequence in sequences]
    if normalisation == "token":
        total = sum(counts)
        return [1.0 / total if total else 0.0 for _ in counts]
    per_rollout: dict[str, int] = defaultdict(int)
    for sequence, count in zip(sequences, counts, strict=True):
        per_rollout[sequence.rollout_id] += count
    trained = sum(1 for count in per_rollout.values() if count)
    return [
        1.0 / (per_rollout[sequence.rollout_id] * trained) if count else 0.0
        for sequence, count in zip(sequences, counts, strict=True)
    ]
