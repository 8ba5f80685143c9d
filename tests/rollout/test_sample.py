"""RolloutSample and AgentWorkflowOutput validation."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy
import pytest
from pydantic import ValidationError

from osmosis_ai.rollout import AgentWorkflowOutput, RolloutSample


def test_trajectory_messages_default_to_an_independent_deep_copy() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    sample = RolloutSample(messages=messages)
    assert sample.trajectory_messages == messages
    assert sample.trajectory_messages is not None
    sample.trajectory_messages[0]["content"][0]["text"] = "changed"
    assert messages[0]["content"][0]["text"] == "hi"


def test_explicit_none_trajectory_messages_means_do_not_persist() -> None:
    assert RolloutSample(messages=[{"a": 1}], trajectory_messages=None).trajectory_messages is None


def test_uncopyable_messages_leave_trajectory_messages_none_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class NoCopy:
        def __deepcopy__(self, memo: dict[int, Any]) -> Any:
            raise TypeError("cannot copy")

    sample = RolloutSample(messages=[{"obj": NoCopy()}])
    assert sample.trajectory_messages is None
    assert "cannot be deep-copied" in caplog.text


def test_reassigning_reward_does_not_touch_trajectory_messages() -> None:
    sample = RolloutSample(messages=[{"role": "user", "content": "x"}])
    copy_before = sample.trajectory_messages
    sample.reward = 0.5
    assert sample.trajectory_messages is copy_before


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "0.5", True, [1.0]])
def test_reward_rejects_non_finite_and_non_numeric_values(bad: Any) -> None:
    sample = RolloutSample()
    with pytest.raises(ValidationError):
        sample.reward = bad
    with pytest.raises(ValidationError):
        RolloutSample(reward=bad)


@pytest.mark.parametrize("good", [0, 1, -1.5, Decimal("0.25"), Fraction(1, 4)])
def test_reward_accepts_real_numbers_as_floats(good: Any) -> None:
    sample = RolloutSample(reward=good)
    assert isinstance(sample.reward, float) and sample.reward == float(good)


def test_sample_rejects_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="rewards"):
        RolloutSample(rewards=1.0)  # type: ignore[call-arg]


def test_output_rejects_unknown_fields_and_non_finite_metrics() -> None:
    with pytest.raises(ValidationError, match="samples"):
        AgentWorkflowOutput(samples=[])  # type: ignore[call-arg]
    for bad in (math.nan, math.inf, -math.inf, "1", False):
        with pytest.raises(ValidationError):
            AgentWorkflowOutput(metrics={"x": bad})


def test_output_revalidates_instances() -> None:
    output = AgentWorkflowOutput(messages=[], metrics={"x": 1.0})
    output.metrics["x"] = math.inf
    with pytest.raises(ValidationError):
        AgentWorkflowOutput.model_validate(output)


def test_json_safe_copy_keeps_clean_values_as_they_are() -> None:
    sample = RolloutSample(metrics={"a": 1, "b": [1.5, "x"]}, extra_fields={"k": None})
    safe = sample.json_safe_copy()
    assert safe.metrics == sample.metrics and safe.extra_fields == sample.extra_fields


def test_json_safe_copy_converts_numpy_scalars_even_when_nothing_is_dropped() -> None:
    sample = RolloutSample(
        messages=[{"role": "assistant", "content": "42"}],
        metrics={
            "f32": numpy.float32(0.5),
            "i64": numpy.int64(7),
            "ok": numpy.bool_(True),
            "nested": {"scores": [numpy.float64(0.25), numpy.int32(3)]},
            "name": numpy.str_("x"),
        },
        extra_fields={"per_key": {numpy.int64(3): numpy.float32(1.5), True: 1, 2.5: "half"}},
    )
    safe = sample.json_safe_copy()
    assert safe.metrics == {
        "f32": 0.5, "i64": 7, "ok": True, "nested": {"scores": [0.25, 3]}, "name": "x"
    }  # fmt: skip
    assert [type(value) for value in safe.metrics.values()][:3] == [float, int, bool]
    # Keys become strings exactly as JSON writes the converted value.
    assert safe.extra_fields == {"per_key": {"3": 1.5, "true": 1, "2.5": "half"}}
    assert json.loads(json.dumps(safe.model_dump(mode="json"), allow_nan=False))["metrics"]
    assert type(sample.metrics["f32"]) is numpy.float32  # the original is untouched
    only_finite = RolloutSample(metrics={"f32": numpy.float32(0.5)}).json_safe_copy()
    assert type(only_finite.metrics["f32"]) is float


def test_json_safe_copy_drops_what_json_cannot_carry(caplog: pytest.LogCaptureFixture) -> None:
    sample = RolloutSample(
        metrics={"nan": math.nan, "ok": 2, "dec": Decimal("1.5"), "tuple": (1, 2)},
        extra_fields={"obj": object(), "nested": {"inf": math.inf, "keep": True}},
    )
    # Keys pydantic would refuse at construction can still be added in place afterwards.
    sample.metrics[3] = "int key"  # type: ignore[index]
    sample.extra_fields[(1,)] = "tuple key"  # type: ignore[index]
    safe = sample.json_safe_copy()
    assert safe.metrics == {"ok": 2, "dec": 1.5, "tuple": [1, 2], "3": "int key"}
    assert safe.extra_fields == {"nested": {"keep": True}}
    json.dumps(safe.model_dump(mode="json"), allow_nan=False)
    assert "metrics.nan" in caplog.text and "extra_fields.obj" in caplog.text
    assert sample.metrics["nan"] is not None  # the original is untouched


def test_turn_rewards_are_finite_numbers_by_model_call_index() -> None:
    """Keys are a model call's index (JSON's text keys read as theirs), values finite."""
    import pydantic

    from osmosis_ai.rollout import AgentWorkflowOutput, GraderContext

    sample = RolloutSample(messages=[], turn_rewards={"2": 1, 0: 0.5})
    assert sample.turn_rewards == {2: 1.0, 0: 0.5}
    for bad in ({-1: 1.0}, {"x": 1.0}, {True: 1.0}, {1: float("nan")}, {1: "0.5"}):
        with pytest.raises(pydantic.ValidationError, match="turn_rewards"):
            RolloutSample(messages=[], turn_rewards=bad)
    assert AgentWorkflowOutput(messages=[], turn_rewards={1: 0.25}).turn_rewards == {1: 0.25}
    ctx = GraderContext(sample=RolloutSample(messages=[]))
    ctx.set_turn_reward(3, 0.5)
    ctx.set_turn_reward(0, -1)
    assert ctx.sample is not None and ctx.sample.turn_rewards == {3: 0.5, 0: -1.0}
    with pytest.raises(pydantic.ValidationError):
        ctx.set_turn_reward(-2, 0.5)
