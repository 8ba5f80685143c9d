"""A step's batch (``loop/batch.py``): groups filtered on the grader's rewards, then shaped."""

from __future__ import annotations

from dataclasses import replace

import pytest

from osmosis_ai.train.algorithm.settings import (
    AlgorithmConfig,
    OverlongConfig,
    TurnCreditConfig,
    UpdateSettings,
)
from osmosis_ai.train.loop.batch import zero_gradient_then_shaped
from tests.train.conftest import make_sequence


def test_groups_are_filtered_on_the_graders_reward_then_shaped() -> None:
    """overlong = "penalty": group "right" is all correct (reward 1) in replies of 10 and 85
    tokens of a 100-token limit (buffer 20: shaped 1.0 and 0.75). Its grader rewards are
    equal, so it carries no gradient and is left out, as DAPO filters on accuracy; shaped
    first it was kept, and std scaling turned its gap of 0.25 into advantages of ±0.71.
    Group "mixed" keeps its gradient, on the shaped rewards."""
    right = [
        replace(make_sequence("r0", "right", 1.0), longest_completion=10),
        replace(make_sequence("r1", "right", 1.0), longest_completion=85),
    ]
    mixed = [
        replace(make_sequence("m0", "mixed", 1.0), longest_completion=95),
        replace(make_sequence("m1", "mixed", 0.0), longest_completion=10),
    ]
    penalty = AlgorithmConfig(overlong=OverlongConfig(mode="penalty", buffer=20))
    shaped, zero = zero_gradient_then_shaped(right + mixed, UpdateSettings(penalty, max_tokens=100))
    assert zero == {"right"}
    assert [s.reward for s in shaped] == pytest.approx([1.0, 0.75, 0.25, 0.0])
    assert zero_gradient_then_shaped(right + mixed, UpdateSettings())[1] == {"right"}


def test_under_turn_credit_a_group_with_unequal_turns_has_a_gradient() -> None:
    turned = [
        replace(make_sequence("a", "g", 1.0), turn_starts=((2, 0),), turn_rewards=((0, 1.0),)),
        replace(make_sequence("b", "g", 1.0), turn_starts=((2, 0),)),
    ]
    assert zero_gradient_then_shaped(turned, UpdateSettings())[1] == {"g"}
    turn = UpdateSettings(AlgorithmConfig(turn_credit=TurnCreditConfig()))
    assert zero_gradient_then_shaped(turned, turn)[1] == set()
