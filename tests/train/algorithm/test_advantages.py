"""Group advantages and token weights, checked against the formulas by hand."""

from __future__ import annotations

import math

import pytest

from osmosis_ai.train.algorithm.advantages import (
    group_advantages,
    overlong_penalty,
    overlong_shaped,
    token_weights,
    turn_advantages,
    zero_gradient_groups,
)
from osmosis_ai.train.algorithm.sequences import TrainingSequence
from osmosis_ai.train.algorithm.settings import AlgorithmConfig
from tests.train.conftest import make_sequence


def _stdev(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_advantages_are_normalised_within_each_group() -> None:
    rewards_a = [1.0, 0.0, 0.5, 0.25]
    rewards_b = [2.0, 4.0]
    sequences = [make_sequence(f"a{i}", "a", r) for i, r in enumerate(rewards_a)]
    sequences += [make_sequence(f"b{i}", "b", r) for i, r in enumerate(rewards_b)]
    mean_a, mean_b = sum(rewards_a) / 4, sum(rewards_b) / 2
    expected = [(r - mean_a) / (_stdev(rewards_a) + 1e-4) for r in rewards_a]
    expected += [(r - mean_b) / (_stdev(rewards_b) + 1e-4) for r in rewards_b]
    assert group_advantages(sequences) == pytest.approx(expected, rel=1e-12)
    unscaled = [r - mean_a for r in rewards_a] + [r - mean_b for r in rewards_b]
    assert group_advantages(sequences, scale="none") == pytest.approx(unscaled, rel=1e-12)


def test_rloo_compares_each_reward_with_the_mean_of_the_others() -> None:
    """Rewards 1, 0, 0: the others' means are 0, 0.5 and 0.5, so the leave-one-out
    advantages are 1, -0.5, -0.5 (GRPO's are 2/3, -1/3, -1/3); a forked rollout counts once.
    RLOO is the reference estimator by default: not divided by the std (divided, it is
    GRPO's advantages times G / (G - 1), which Adam cancels)."""
    sequences = [
        make_sequence("x", "g", 1.0),
        make_sequence("x", "g", 1.0, tokens=(5, 6, 7, 8)),
        make_sequence("y", "g", 0.0),
        make_sequence("z", "g", 0.0),
    ]
    reference = [1.0, 1.0, -0.5, -0.5]
    assert group_advantages(sequences, baseline="rloo") == pytest.approx(reference, rel=1e-12)
    assert AlgorithmConfig(advantage="rloo").scale == "none"
    assert AlgorithmConfig(advantage="rloo", advantage_scale="std").scale == "std"
    assert AlgorithmConfig().scale == "std"
    assert group_advantages(sequences, scale="none") == pytest.approx(
        [2 / 3, 2 / 3, -1 / 3, -1 / 3], rel=1e-12
    )
    # Divided by the std, RLOO is GRPO scaled by G / (G - 1) = 3/2.
    grpo = group_advantages(sequences)
    assert group_advantages(sequences, baseline="rloo", scale="std") == pytest.approx(
        [1.5 * value for value in grpo], rel=1e-12
    )


def test_a_forked_rollout_counts_once_in_its_group() -> None:
    sequences = [
        make_sequence("x", "g", 1.0),
        make_sequence("x", "g", 1.0, tokens=(5, 6, 7, 8)),
        make_sequence("y", "g", 0.0),
    ]
    # Group {x: 1, y: 0}: mean 0.5, not (1 + 1 + 0) / 3.
    advantages = group_advantages(sequences, scale="none")
    assert advantages == pytest.approx([0.5, 0.5, -0.5])


def test_groups_with_equal_rewards_carry_no_gradient() -> None:
    sequences = [
        make_sequence("a0", "same", 0.5),
        make_sequence("a1", "same", 0.5),
        make_sequence("b0", "single", 1.0),
        make_sequence("c0", "mixed", 0.0),
        make_sequence("c1", "mixed", 1.0),
    ]
    assert zero_gradient_groups(sequences) == {"same", "single"}
    assert group_advantages(sequences)[:3] == [0.0, 0.0, 0.0]
    assert all(a != 0 for a in group_advantages(sequences)[3:])


def test_token_and_sequence_normalisation_weigh_tokens_differently() -> None:
    long = make_sequence("a", "g", 1.0, tuple(range(1, 9)), (0, 0, 1, 1, 1, 1, 1, 1))
    short = make_sequence("b", "g", 0.0, (1, 2, 3), (0, 0, 1))
    # DAPO: every token of the step weighs 1/7. GRPO: each sequence weighs 1/2 in total.
    assert token_weights([long, short], "token") == pytest.approx([1 / 7, 1 / 7])
    assert token_weights([long, short], "sequence") == pytest.approx([1 / 12, 1 / 2])


def test_sequence_normalisation_weighs_a_forked_rollout_once() -> None:
    """A rollout split into two pieces by a fork weighs as much as an unsplit one: its
    tokens are averaged over both pieces, not each piece counted as a sequence."""
    first = make_sequence("a", "g", 1.0, (1, 2, 3, 4), (0, 0, 1, 1))
    second = make_sequence("a", "g", 1.0, (5, 6, 7, 8), (0, 1, 1, 1))
    whole = make_sequence("b", "g", 0.0, (1, 2, 3), (0, 0, 1))
    weights = token_weights([first, second, whole], "sequence")
    assert weights == pytest.approx([1 / 10, 1 / 10, 1 / 2])
    forked = weights[0] * first.policy_tokens + weights[1] * second.policy_tokens
    assert forked == pytest.approx(weights[2] * whole.policy_tokens) == pytest.approx(1 / 2)


def test_constant_normalisation_divides_each_rollouts_sum_by_one_constant() -> None:
    """Dr. GRPO: 1 / (constant × rollouts) per token, whatever a rollout's length: two
    rollouts of 2 and 3 policy tokens (one forked in two pieces) under a constant of 8."""
    sequences = [
        make_sequence("a", "g", 1.0, (1, 2, 3, 4)),  # 2 policy tokens
        make_sequence("b", "g", 0.0, (1, 2, 3)),  # 1 ...
        make_sequence("b", "g", 0.0, (5, 6, 7, 8)),  # ... and 2 more: one rollout of 3
    ]
    assert token_weights(sequences, "constant", 8) == pytest.approx([1 / 16] * 3)


def test_the_overlong_penalty_falls_from_0_to_minus_1_over_the_buffer() -> None:
    """DAPO's soft punishment with a limit of 100 and a buffer of 20: free up to 80 tokens,
    then linear to -1 at the limit; a buffer of 0 is a fifth of the limit."""
    values = [overlong_penalty(n, 100, 20) for n in (10, 80, 90, 99, 100)]
    assert values == pytest.approx([0.0, 0.0, -0.5, -0.95, -1.0])
    assert overlong_penalty(90, 100, 0) == pytest.approx(-0.5)


def test_overlong_shaping_lowers_the_reward_of_long_rollouts_only() -> None:
    import dataclasses

    short = dataclasses.replace(make_sequence("a", "g", 1.0), longest_completion=10)
    long = dataclasses.replace(make_sequence("b", "g", 1.0), longest_completion=95, truncated=True)
    shaped = overlong_shaped([short, long], max_tokens=100, buffer=20)
    assert [s.reward for s in shaped] == pytest.approx([1.0, 0.25])
    # Equal grader rewards, different lengths: the group now has a gradient.
    assert group_advantages(shaped)[0] > 0 > group_advantages(shaped)[1]


def _turned(
    rollout: str, length: int, turns: tuple[tuple[int, int], ...], rewards: dict[int, float]
) -> TrainingSequence:
    """A sequence of ``length`` tokens (two of context first) whose completions start at
    ``turns`` (position, call index), its rollout's turn rewards beside."""
    import dataclasses

    mask = [0, 0] + [1] * (length - 2)
    return dataclasses.replace(
        make_sequence(rollout, "g", 1.0, tuple(range(1, length + 1)), mask),
        turn_starts=turns,
        turn_rewards=tuple(sorted(rewards.items())),
    )


def test_a_turns_advantage_is_its_return_against_the_same_turn_of_the_others() -> None:
    """Rollout a: turns 0, 1, 2 with rewards 1 at turns 0 and 2; b: turns 0, 1, reward 0 at
    0; c: turn 0 only. γ = 0.5: a's returns are 1.25, 0.5, 1; b's 0, 0; c's 0. The scale s is
    the sample std of those six values (0.557150) + 1e-4, as the outcome's is. a's turn 0 is
    compared with b's and c's turn 0 (mean 0): 1.25 / s; its turn 1 with b's (0): 0.5 / s; no
    one else reached its turn 2: 0. b's turn 0 against a's and c's (0.625): -0.625 / s, its
    turn 1 against a's (0.5): -0.5 / s; c's turn 0 against 0.625: -0.625 / s. With λ = 0.5 and
    outcome advantages 0.3, -0.1, -0.2, each turn's tokens get outcome + λ·turn."""
    a = _turned("a", 8, ((2, 0), (4, 1), (6, 2)), {0: 1.0, 2: 1.0})
    b = _turned("b", 6, ((2, 0), (4, 1)), {0: 0.0})
    c = _turned("c", 4, ((2, 0),), {})
    s = 0.557150 + 1e-4
    got = turn_advantages([a, b, c], [0.3, -0.1, -0.2], discount=0.5, weight=0.5)
    expected = [
        [0.3] * 2 + [0.3 + 0.5 * 1.25 / s] * 2 + [0.3 + 0.5 * 0.5 / s] * 2 + [0.3] * 2,
        [-0.1] * 2 + [-0.1 - 0.5 * 0.625 / s] * 2 + [-0.1 - 0.5 * 0.5 / s] * 2,
        [-0.2] * 2 + [-0.2 - 0.5 * 0.625 / s] * 2,
    ]
    for row, values in zip(got, expected, strict=True):
        assert list(row) == pytest.approx(values, abs=1e-5)


def test_without_turn_rewards_turn_credit_is_the_outcome_and_a_fork_counts_once() -> None:
    plain = [_turned("a", 4, ((2, 0),), {}), _turned("b", 4, ((2, 0),), {})]
    assert turn_advantages(plain, [0.5, -0.5], discount=0.5, weight=1.0) == [
        (0.5,) * 4,
        (-0.5,) * 4,
    ]
    # a forked into two pieces (turns 0 and 1): both pieces are one rollout with two turns.
    pieces = [
        _turned("a", 4, ((2, 0),), {1: 1.0}),
        _turned("a", 4, ((2, 1),), {1: 1.0}),
        _turned("b", 6, ((2, 0), (4, 1)), {}),
    ]
    first, second, other = turn_advantages(pieces, [0.0, 0.0, 0.0], discount=1.0, weight=1.0)
    # Returns: a 1, 1; b 0, 0; s = stdev(1, 1, 0, 0) + 1e-4: a's turns +1/s, b's -1/s.
    s = math.sqrt(1 / 3) + 1e-4
    assert first[2] == pytest.approx(1 / s) and second[2] == pytest.approx(1 / s)
    assert other[2] == pytest.approx(-1 / s) and other[4] == pytest.approx(-1 / s)


def test_turn_credit_is_scaled_as_the_outcome_is() -> None:
    """Under ``scale = "none"`` neither term is divided: the rollouts of the first turn test,
    whose returns are in reward units, get outcome + λ·(g - b), so λ weighs the two terms
    alike whatever the rewards' scale (once the turn term alone was divided by the std)."""
    a = _turned("a", 8, ((2, 0), (4, 1), (6, 2)), {0: 1.0, 2: 1.0})
    b = _turned("b", 6, ((2, 0), (4, 1)), {0: 0.0})
    c = _turned("c", 4, ((2, 0),), {})
    got = turn_advantages([a, b, c], [0.3, -0.1, -0.2], discount=0.5, weight=0.5, scale="none")
    expected = [
        [0.3] * 2 + [0.3 + 0.5 * 1.25] * 2 + [0.3 + 0.5 * 0.5] * 2 + [0.3] * 2,
        [-0.1] * 2 + [-0.1 - 0.5 * 0.625] * 2 + [-0.1 - 0.5 * 0.5] * 2,
        [-0.2] * 2 + [-0.2 - 0.5 * 0.625] * 2,
    ]
    for row, values in zip(got, expected, strict=True):
        assert list(row) == pytest.approx(values, abs=1e-9)


def test_a_group_is_zero_gradient_under_turn_credit_only_when_its_turns_are_equal_too() -> None:
    """Equal outcomes: under outcome credit the group is zero-gradient. Under turn credit it
    is not while a turn two rollouts reached has different returns; it is again when every
    such turn's returns are equal (then every turn advantage is 0 too), and a turn only one
    rollout reached (no baseline, 0) does not count."""
    differ = [_turned("a", 4, ((2, 0),), {0: 1.0}), _turned("b", 4, ((2, 0),), {})]
    assert zero_gradient_groups(differ) == {"g"}
    assert zero_gradient_groups(differ, turn_discount=0.5) == set()
    same = [
        _turned("a", 6, ((2, 0), (4, 1)), {0: 1.0, 1: 1.0}),
        _turned("b", 4, ((2, 0),), {0: 1.5}),
    ]
    # Returns at turn 0: a 1 + 0.5·1 = 1.5, b 1.5; only a reached turn 1.
    assert zero_gradient_groups(same, turn_discount=0.5) == {"g"}
    assert all(
        set(row) == {0.25} for row in turn_advantages(same, [0.25, 0.25], discount=0.5, weight=1.0)
    )
