"""How much each sequence counts in a step's loss: group advantages and per-token weights.

- ``group_advantages``: ``(r - mean) / (std + eps)`` within each group of rollouts of one
  dataset row, or ``r - mean`` (``scale="none"``, Dr. GRPO); against the mean of the
  others with ``baseline="rloo"``. ``zero_gradient_groups`` names
  the groups whose rewards are all equal: they carry no gradient.
- ``token_weights``: how the loss averages tokens: over the step's tokens, per rollout, or
  per rollout over a constant.
- ``overlong_penalty``: DAPO's soft penalty for replies that ran to their token limit.

Pure Python (no torch): the runner picks the groups to run again before any update.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Literal

from osmosis_ai.train.algorithm.sequences import TrainingSequence

__all__ = [
    "Baseline",
    "Scale",
    "group_advantages",
    "overlong_penalty",
    "overlong_shaped",
    "relative_advantages",
    "token_weights",
    "zero_gradient_groups",
]


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


Baseline = Literal["grpo", "rloo"]
Scale = Literal["std", "none"]


def group_advantages(
    sequences: Sequence[TrainingSequence],
    *,
    baseline: Baseline = "grpo",
    scale: Scale = "std",
    eps: float = 1e-4,
) -> list[float]:
    """The advantage of each sequence: its rollout's reward against a baseline from its group
    (`relative_advantages` of the group's rewards). Each rollout counts once however many
    sequences it forked into.
    """
    by_group: dict[str, dict[str, float]] = {}
    for group, rewards in _group_rewards(sequences).items():
        values = relative_advantages(
            list(rewards.values()), baseline=baseline, scale=scale, eps=eps
        )
        by_group[group] = dict(zip(rewards, values, strict=True))
    return [by_group[s.group_id][s.rollout_id] for s in sequences]


def relative_advantages(
    rewards: Sequence[float],
    *,
    baseline: Baseline = "grpo",
    scale: Scale = "std",
    eps: float = 1e-4,
) -> list[float]:
    """The advantages of one group's rewards (one per rollout).

    ``baseline="grpo"`` compares each with the group's mean; ``"rloo"`` with the mean of the
    group's *other* rewards (REINFORCE leave-one-out, Ahmadian et al. 2024), an unbiased
    baseline since it does not depend on the rollout itself: ``r - mean_others``, which is
    ``G / (G - 1)`` times ``r - mean``. ``scale="std"`` then divides by the group's sample
    standard deviation plus ``eps`` (Bessel-corrected, as TRL's GRPO); ``"none"`` does not
    (Dr. GRPO). A group whose rewards are all equal (one rollout included) gets 0s.
    """
    if len(set(rewards)) <= 1:
        return [0.0] * len(rewards)
    mean = statistics.fmean(rewards)
    # Leave-one-out: r - (sum - r) / (G - 1) = (r - mean) * G / (G - 1); G >= 2 here.
    spread = len(rewards) / (len(rewards) - 1) if baseline == "rloo" else 1.0
    divisor = statistics.stdev(rewards) + eps if scale == "std" else 1.0
    return [(r - mean) * spread / divisor for r in rewards]


def token_weights(
    sequences: Sequence[TrainingSequence],
    normalisation: Literal["token", "sequence", "constant"],
    max_tokens: int = 1024,
) -> list[float]:
    """The weight of one policy token of each sequence, so the step's loss is a weighted sum.

    ``"token"``: 1 / (policy tokens of the whole step), every token counts the same (DAPO).
    ``"sequence"``: 1 / (the rollout's policy tokens × rollouts), every rollout counts the
    same (GRPO), once however many sequences a fork split it into: its tokens are averaged
    over all its pieces. ``"constant"``: 1 / (``max_tokens`` × rollouts), each rollout's
    tokens summed and divided by one constant (Dr. GRPO, Liu et al. 2025): a long reply's
    tokens weigh what a short one's do, so the loss has no length bias. Computed over all of
    ``sequences``, so micro-batches add up to their full-batch loss.
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
        1.0 / (max_tokens if normalisation == "constant" else per_rollout[s.rollout_id]) / trained
        if count
        else 0.0
        for s, count in zip(sequences, counts, strict=True)
    ]


def overlong_penalty(longest: int, max_tokens: int, buffer: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476) of a rollout whose
    longest model call generated ``longest`` tokens of at most ``max_tokens``: 0 up to
    ``max_tokens - buffer`` tokens, then falling linearly to -1 at ``max_tokens`` (a reply
    cut off there). ``buffer`` 0 means a fifth of ``max_tokens`` (DAPO's 4,096 of 20,480)."""
    buffer = buffer or max(1, max_tokens // 5)
    free = max_tokens - buffer
    return 0.0 if longest <= free else max(-1.0, (free - longest) / buffer)


def overlong_shaped(
    sequences: Sequence[TrainingSequence], max_tokens: int, buffer: int
) -> list[TrainingSequence]:
    """``sequences`` with `overlong_penalty` added to each rollout's reward (the grader's
    reward stays in the rollout's record; this shapes only what the update learns from)."""
    return [
        dataclasses.replace(
            s, reward=s.reward + overlong_penalty(s.longest_completion, max_tokens, buffer)
        )
        for s in sequences
    ]
