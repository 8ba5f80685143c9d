"""On-policy distillation's advantages (pure): the teacher's gap on each policy token, the
reward's advantage beside it, and the reverse KL the step reports."""

from __future__ import annotations

import pytest

from osmosis_ai.train.algorithm.distill import distill_advantages, reverse_kl
from tests.train.conftest import make_sequence


def test_each_policy_token_gets_the_teachers_gap_and_the_context_none() -> None:
    sequence = make_sequence("r1", "g", 1.0, logprobs=[0.0, 0.0, -1.0, -3.0])
    [advantages] = distill_advantages(
        [sequence], [0.5], [(0.0, -9.0, -0.5, -4.0)], weight=2.0, reward_weight=0.0
    )
    # Token 2: the teacher finds it likelier (+0.5 nats, pushed up); token 3 less (-1, down).
    assert advantages == (0.0, 0.0, 1.0, -2.0)


def test_the_rewards_advantage_is_added_at_its_weight_per_sequence_or_per_token() -> None:
    sequence = make_sequence("r1", "g", 1.0, logprobs=[0.0, 0.0, -1.0, -1.0])
    teacher = [(0.0, 0.0, -1.0, -2.0)]
    [flat] = distill_advantages([sequence], [0.5], teacher, weight=1.0, reward_weight=2.0)
    assert flat == (1.0, 1.0, 1.0, 0.0)
    [per_token] = distill_advantages(
        [sequence], [(0.0, 0.0, 0.25, 0.75)], teacher, weight=1.0, reward_weight=1.0
    )
    assert per_token == (0.0, 0.0, 0.25, -0.25)


def test_the_reverse_kl_is_the_mean_gap_over_the_policy_tokens() -> None:
    sequences = [
        make_sequence("r1", "g", 1.0, logprobs=[0.0, 0.0, -1.0, -1.0]),
        make_sequence("r2", "g", 0.0, tokens=(1, 2, 3), logprobs=[0.0, 0.0, -2.0]),
    ]
    teacher = [(5.0, 5.0, -2.0, -3.0), (5.0, 5.0, -2.0)]
    assert reverse_kl(sequences, teacher) == pytest.approx((1.0 + 2.0 + 0.0) / 3)
    assert reverse_kl([], []) == 0.0


def test_teacher_logprobs_of_another_length_are_refused() -> None:
    sequence = make_sequence("r1", "g", 1.0)
    with pytest.raises(ValueError, match="3 for a sequence of 4 tokens"):
        distill_advantages([sequence], [0.0], [(0.0, 0.0, 0.0)], weight=1.0, reward_weight=0.0)
