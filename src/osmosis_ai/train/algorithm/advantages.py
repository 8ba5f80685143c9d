"""How much each sequence counts in a step's loss: group advantages and per-token weights.

- ``group_advantages``: ``(r - mean) / (std + eps)`` within each group of rollouts of one
  dataset row, or ``r - mean`` (``scale="none"``, Dr. GRPO); against the mean of the
  others with ``baseline="rloo"``. ``zero_gradient_groups`` names the groups whose rewards
  (and, under credit per turn, turn returns) are all equal: they carry no gradient.
- ``token_weights``: how the loss averages tokens: over the step's tokens, per rollout, or
  per rollout over a constant.
- ``overlong_penalty``: DAPO's soft penalty for replies that ran to their token limit.
- ``turn_advantages``: credit per turn, from the turn rewards a workflow or grader set.

Pure Python (no torch): the runner picks the groups to run again before any update.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal

from osmosis_ai.train.algorithm.sequences import TrainingSequence

if TYPE_CHECKING:
    from osmosis_ai.train.algorithm.settings import AlgorithmConfig

__all__ = [
    "Baseline",
    "Normalisation",
    "Scale",
    "baseline_scale",
    "group_advantages",
    "overlong_penalty",
    "overlong_shaped",
    "relative_advantages",
    "step_advantages",
    "token_weights",
    "turn_advantages",
    "zero_gradient_groups",
]


def _group_rewards(sequences: Iterable[TrainingSequence]) -> dict[str, dict[str, float]]:
    """group id -> rollout id -> reward (a rollout's forked sequences count once)."""
    groups: dict[str, dict[str, float]] = defaultdict(dict)
    for sequence in sequences:
        groups[sequence.group_id][sequence.rollout_id] = sequence.reward
    return groups


def zero_gradient_groups(
    sequences: Iterable[TrainingSequence], turn_discount: float | None = None
) -> set[str]:
    """Groups whose rollouts all have the same reward (a single rollout included), and under
    credit per turn (``turn_discount`` given) the same turn return at every turn that two of
    them reached.

    Their advantages are all 0 (`turn_advantages` too), so they add no gradient: a runner
    skips or resamples them. The rewards are the ones the sequences carry: pass the grader's,
    before any shaping (DAPO filters groups on accuracy, then shapes).
    """
    sequences = list(sequences)
    flat = {group for group, rewards in _group_rewards(sequences).items() if _equal(rewards)}
    if turn_discount is None:
        return flat
    returns = _turn_returns(sequences, turn_discount)
    members = _members(sequences)
    return {
        group
        for group in flat
        if all(
            _equal({r: returns[r][turn] for r in members[group] if turn in returns[r]})
            for turn in {turn for r in members[group] for turn in returns[r]}
        )
    }


def _equal(values: dict[str, float]) -> bool:
    """Whether ``values`` hold one value at most."""
    return len(set(values.values())) <= 1


Baseline = Literal["grpo", "rloo"]
Scale = Literal["std", "none"]
#: How a step's loss averages its tokens (`token_weights`).
Normalisation = Literal["token", "sequence", "constant"]


def baseline_scale(baseline: Baseline) -> Scale:
    """The scale a baseline comes with: GRPO divides by the group's std; RLOO's reference
    estimator (Ahmadian et al. 2024, verl, TRL) does not, and divided by it RLOO would be
    GRPO times ``G / (G - 1)``, a constant that Adam cancels."""
    return "none" if baseline == "rloo" else "std"


def group_advantages(
    sequences: Sequence[TrainingSequence],
    *,
    baseline: Baseline = "grpo",
    scale: Scale | None = None,
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
    scale: Scale | None = None,
    eps: float = 1e-4,
) -> list[float]:
    """The advantages of one group's rewards (one per rollout); ``scale`` ``None`` is the
    baseline's own (`baseline_scale`).

    ``baseline="grpo"`` compares each with the group's mean; ``"rloo"`` with the mean of the
    group's *other* rewards (REINFORCE leave-one-out, Ahmadian et al. 2024):
    ``r - mean_others``, which is ``G / (G - 1)`` times ``r - mean``. That baseline does not
    depend on the rollout it is subtracted from, so with ``scale="none"`` the estimate of the
    policy gradient is unbiased (GRPO's mean is ``(G - 1) / G`` of it: the same direction).
    ``scale="std"`` then divides by the group's sample standard deviation plus ``eps``
    (Bessel-corrected, as TRL's GRPO), which depends on every reward of the group, the
    rollout's own included: no estimate divided by it is unbiased, and RLOO divided by it is
    GRPO times ``G / (G - 1)``. A group whose rewards are all equal (one rollout included)
    gets 0s.
    """
    if len(set(rewards)) <= 1:
        return [0.0] * len(rewards)
    mean = statistics.fmean(rewards)
    # Leave-one-out: r - (sum - r) / (G - 1) = (r - mean) * G / (G - 1); G >= 2 here.
    spread = len(rewards) / (len(rewards) - 1) if baseline == "rloo" else 1.0
    divisor = _divisor(rewards, scale or baseline_scale(baseline), eps)
    return [(r - mean) * spread / divisor for r in rewards]


def _divisor(values: Sequence[float], scale: Scale, eps: float) -> float:
    """What a group's advantages are divided by: the sample standard deviation of
    ``values`` plus ``eps`` (``"std"``), or 1 (``"none"``)."""
    if scale == "none":
        return 1.0
    return (statistics.stdev(values) if len(values) > 1 else 0.0) + eps


def token_weights(
    sequences: Sequence[TrainingSequence],
    normalisation: Normalisation,
    max_tokens: int = 1024,
    *,
    leave_out_truncated: bool = False,
) -> list[float]:
    """The weight of one policy token of each sequence, so the step's loss is a weighted sum.

    ``leave_out_truncated`` (``overlong = "mask"``): a sequence whose rollout stopped at its
    token limit weighs 0, and the others are weighed as if it were not there.

    ``"token"``: 1 / (policy tokens of the whole step), every token counts the same (DAPO).
    ``"sequence"``: 1 / (the rollout's policy tokens × rollouts), every rollout counts the
    same (GRPO), once however many sequences a fork split it into: its tokens are averaged
    over all its pieces. ``"constant"``: 1 / (``max_tokens`` × rollouts), each rollout's
    tokens summed and divided by one constant (Dr. GRPO, Liu et al. 2025): a long reply's
    tokens weigh what a short one's do, so the loss has no length bias. Computed over all of
    ``sequences``, so micro-batches add up to their full-batch loss.
    """
    counts = [
        0 if leave_out_truncated and sequence.truncated else sequence.policy_tokens
        for sequence in sequences
    ]
    if normalisation == "token":
        total = sum(counts)
        return [1.0 / total if count else 0.0 for count in counts]
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


def turn_advantages(
    sequences: Sequence[TrainingSequence],
    outcome: Sequence[float],
    *,
    discount: float,
    weight: float,
    scale: Scale = "std",
    eps: float = 1e-4,
) -> list[tuple[float, ...]]:
    """Each sequence's advantage per token (``len(sequence)`` values): the rollout's
    ``outcome`` advantage plus ``weight`` × its turn's advantage on the tokens of that turn.

    For rollout ``i`` of a group and its turn (model call) ``t``: the return of the turn
    rewards from ``t`` on, ``g_it = Σ_k≥t discount^(k-t)·r_ik`` (a turn without a reward
    counts 0); the baseline ``b_it``, the mean of ``g_jt`` over the *other* rollouts of the
    group that reached turn ``t``; the turn advantage ``(g_it - b_it) / d``, where ``d`` is
    what ``scale`` divides the outcome's by, taken over the group's ``g`` values: their
    sample standard deviation plus ``eps`` (``"std"``), or 1 (``"none"``), so the two terms
    are in the same units and ``weight`` means the same whatever the rewards' scale. It is 0
    where no other rollout reached turn ``t`` (there is no baseline to compare with; the
    turn's reward still reaches the earlier turns' returns through ``discount``), and for a
    group without turn rewards (plain outcome credit).

    Why this way: a turn is compared with the same turn of the prompt's other attempts, so a
    baseline never depends on how many turns a rollout chose to take (normalising each turn
    index on its own and summing, or pooling all turns of all rollouts, both reward length:
    early turns have more reward ahead of them); one scale per group keeps turns comparable;
    the outcome stays the main signal, turn rewards shape it (``weight`` <= 1). A forked
    rollout's pieces share its turns, so it counts once. The baseline is a valid one (it
    never depends on the rollout it is subtracted from); the estimate is not unbiased for
    the outcome's gradient: the turn rewards are a shaped objective beside it, and a std
    scale depends on the group's own returns.
    """
    returns = _turn_returns(sequences, discount)
    rewarded = {s.rollout_id for s in sequences if s.turn_rewards}
    credit: dict[str, dict[int, float]] = {rollout: {} for rollout in returns}
    for rollouts in _members(sequences).values():
        if not rewarded.intersection(rollouts):
            continue
        values = [g for rollout in rollouts for g in returns[rollout].values()]
        divisor = _divisor(values, scale, eps)
        for rollout in rollouts:
            for turn, value in returns[rollout].items():
                others = [returns[o][turn] for o in rollouts if o != rollout and turn in returns[o]]
                if others:
                    credit[rollout][turn] = (value - statistics.fmean(others)) / divisor
    out: list[tuple[float, ...]] = []
    for sequence, base in zip(sequences, outcome, strict=True):
        per_token = [base] * len(sequence)
        starts = [*sequence.turn_starts, (len(sequence), -1)]
        for (start, turn), (end, _) in zip(starts, starts[1:], strict=False):
            extra = weight * credit[sequence.rollout_id].get(turn, 0.0)
            per_token[start:end] = [base + extra] * (end - start)
        out.append(tuple(per_token))
    return out


def _members(sequences: Iterable[TrainingSequence]) -> dict[str, list[str]]:
    """group id -> its rollout ids, each once (a forked rollout has several sequences)."""
    members: dict[str, list[str]] = defaultdict(list)
    for sequence in sequences:
        if sequence.rollout_id not in members[sequence.group_id]:
            members[sequence.group_id].append(sequence.rollout_id)
    return members


def _turn_returns(
    sequences: Iterable[TrainingSequence], discount: float
) -> dict[str, dict[int, float]]:
    """rollout id -> turn it reached -> the discounted return of its turn rewards from that
    turn on (a turn without a reward counts 0; a forked rollout's pieces share its turns)."""
    turns_of: dict[str, set[int]] = defaultdict(set)
    rewards_of: dict[str, dict[int, float]] = {}
    for sequence in sequences:
        turns_of[sequence.rollout_id].update(index for _, index in sequence.turn_starts)
        rewards_of[sequence.rollout_id] = dict(sequence.turn_rewards)
    returns: dict[str, dict[int, float]] = {}
    for rollout, turns in turns_of.items():
        rewards = rewards_of[rollout]
        ahead, by_turn = 0.0, {}
        for turn in range(max([*turns, *rewards], default=-1), -1, -1):
            ahead = rewards.get(turn, 0.0) + discount * ahead
            if turn in turns:
                by_turn[turn] = ahead
        returns[rollout] = by_turn
    return returns


def step_advantages(
    sequences: Sequence[TrainingSequence], algorithm: AlgorithmConfig
) -> list[float | tuple[float, ...]]:
    """Each sequence's advantage as ``[algorithm]`` says: its group's (`group_advantages`),
    and with ``[algorithm.turn_credit]`` one per token run of each turn (`turn_advantages`)."""
    from osmosis_ai.train.algorithm.settings import ADVANTAGE_EPS

    outcome = group_advantages(
        sequences, baseline=algorithm.advantage, scale=algorithm.scale, eps=ADVANTAGE_EPS
    )
    credit = algorithm.turn_credit
    if credit is None:
        return list(outcome)
    return list(
        turn_advantages(
            sequences, outcome, discount=credit.discount, weight=credit.weight,
            scale=algorithm.scale, eps=ADVANTAGE_EPS,
        )
    )  # fmt: skip
