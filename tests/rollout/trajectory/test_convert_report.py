"""Merging a trajectory report into the converted document (reference section 4.5)."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from pydantic import ValidationError

from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.trajectory import (
    LlmCallMetrics,
    SampleReport,
    TrajectoryReport,
    convert_sample_to_trajectory,
)

MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "q"},
    {
        "role": "assistant",
        "content": "",
        "model": "inline-model",
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "cost_usd": 0.25},
        "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "r"},
    {"role": "assistant", "content": "done"},
]


def convert(report: dict[str, Any] | None, **kwargs: Any) -> dict[str, Any]:
    parsed = TrajectoryReport.model_validate(report) if report is not None else None
    trajectory = convert_sample_to_trajectory(
        RolloutSample(messages=MESSAGES), rollout_id="r", report=parsed, **kwargs
    )
    return trajectory.to_json_dict()


def agent_steps(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for step in document["steps"] if step["source"] == "agent"]


def one_sample(**sample_report: Any) -> dict[str, Any]:
    return {"samples": {"whatever-key": sample_report}}


def test_single_sample_report_is_applied_whatever_its_key() -> None:
    document = convert(one_sample(llm_call_metrics=[{}, {"prompt_tokens": 30}]))
    first, second = agent_steps(document)
    assert first["metrics"] == {"prompt_tokens": 10, "completion_tokens": 2, "cost_usd": 0.25}
    assert second["metrics"] == {"prompt_tokens": 30}
    assert first["llm_call_count"] == second["llm_call_count"] == 1


def test_report_fields_win_over_inline_metrics_field_by_field() -> None:
    entry = {
        "prompt_tokens": 11,
        "cost_usd": None,
        "completion_token_ids": [5, 6],
        "logprobs": [-0.5, -0.25],
        "extra": {"gateway": "g1"},
    }
    messages = [
        {
            "role": "assistant",
            "content": "",
            "usage": {
                "prompt_tokens": 10,
                "cost_usd": 0.25,
                "completion_tokens_details": {"reasoning_tokens": 1},
            },
        }
    ]
    trajectory = convert_sample_to_trajectory(
        RolloutSample(messages=messages),
        rollout_id="r",
        report=TrajectoryReport.model_validate(one_sample(llm_call_metrics=[entry])),
    )
    (step,) = trajectory.to_json_dict()["steps"]
    assert step["metrics"] == {
        "prompt_tokens": 11,
        "cost_usd": 0.25,
        "completion_token_ids": [5, 6],
        "logprobs": [-0.5, -0.25],
        "extra": {"completion_tokens_details": {"reasoning_tokens": 1}, "gateway": "g1"},
    }


def test_model_name_of_an_entry_wins_over_the_message_model() -> None:
    document = convert(one_sample(llm_call_metrics=[{"model_name": "served"}, {}]))
    first, second = agent_steps(document)
    assert first["model_name"] == "served"
    assert "model_name" not in second


def test_empty_entry_still_marks_one_llm_call() -> None:
    document = convert(one_sample(llm_call_metrics=[{}, {}]))
    assert agent_steps(document)[1] == {
        "step_id": 3,
        "source": "agent",
        "message": "done",
        "llm_call_count": 1,
    }


@pytest.mark.parametrize(
    ("report", "kwargs", "model_name"),
    [
        ({"model_name": "top", **one_sample(model_name="sample")}, {}, "sample"),
        ({"model_name": "top", **one_sample()}, {"default_model_name": "default"}, "top"),
        (one_sample(), {"default_model_name": "default"}, "default"),
        (None, {"default_model_name": "default"}, "default"),
        (None, {}, None),
    ],
)
def test_agent_model_name_prefers_sample_then_report_then_default(
    report: dict[str, Any] | None, kwargs: dict[str, Any], model_name: str | None
) -> None:
    assert convert(report, **kwargs)["agent"].get("model_name") == model_name


def test_count_mismatch_applies_nothing_and_preserves_entries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    entries = [{"prompt_tokens": 1}, {"prompt_tokens": 2}, {"prompt_tokens": 3}]
    with caplog.at_level(logging.WARNING):
        document = convert(one_sample(llm_call_metrics=entries))
    first, second = agent_steps(document)
    assert first["metrics"]["prompt_tokens"] == 10
    assert "metrics" not in second and "llm_call_count" not in second
    assert document["extra"]["osmosis"]["unmatched_llm_call_metrics"] == entries
    assert "3 llm_call_metrics for 2 agent steps" in caplog.text


def test_several_sample_reports_apply_none_and_are_preserved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    report = {
        "model_name": "top",
        "samples": {
            "a": {"model_name": "ma", "llm_call_metrics": [{"prompt_tokens": 1}, {}]},
            "b": {"final_metrics": {"total_prompt_tokens": 99}},
        },
    }
    with caplog.at_level(logging.WARNING):
        document = convert(report)
    assert agent_steps(document)[0]["metrics"]["prompt_tokens"] == 10
    assert document["agent"]["model_name"] == "top"
    assert document["final_metrics"]["total_prompt_tokens"] == 10
    assert document["extra"]["osmosis"]["unmatched_sample_reports"] == {
        "a": {"model_name": "ma", "llm_call_metrics": [{"prompt_tokens": 1}, {}]},
        "b": {"llm_call_metrics": [], "final_metrics": {"total_prompt_tokens": 99}},
    }
    assert "2 sample entries" in caplog.text


def test_final_metrics_are_summed_over_steps_when_not_reported() -> None:
    document = convert(one_sample(llm_call_metrics=[{}, {"prompt_tokens": 5, "cost_usd": 0.5}]))
    assert document["final_metrics"] == {
        "total_prompt_tokens": 15,
        "total_completion_tokens": 2,
        "total_cost_usd": 0.75,
        "total_steps": 3,
    }


def test_explicit_final_metrics_win_and_their_total_steps_is_ignored() -> None:
    totals = {"total_prompt_tokens": 1000, "total_steps": 42, "extra": {"source": "gateway"}}
    document = convert(one_sample(final_metrics=totals))
    assert document["final_metrics"] == {
        "total_prompt_tokens": 1000,
        "total_completion_tokens": 2,
        "total_cost_usd": 0.25,
        "total_steps": 3,
        "extra": {"source": "gateway"},
    }


@pytest.mark.parametrize(
    "totals",
    [{"total_prompt_tokens": "lots"}, {"total_cost_usd": math.inf}, [1, 2], "n/a"],
    ids=["bad-count", "infinite-cost", "list", "string"],
)
def test_malformed_final_metrics_fall_back_to_summed_totals(
    totals: Any, caplog: pytest.LogCaptureFixture
) -> None:
    report = TrajectoryReport(samples={"s": SampleReport(final_metrics=totals)})
    with caplog.at_level(logging.WARNING):
        trajectory = convert_sample_to_trajectory(
            RolloutSample(messages=MESSAGES), rollout_id="r", report=report
        )
    assert trajectory.to_json_dict()["final_metrics"]["total_prompt_tokens"] == 10
    assert "final_metrics is malformed" in caplog.text


def test_final_metrics_hold_only_total_steps_without_any_usage() -> None:
    trajectory = convert_sample_to_trajectory(
        RolloutSample(messages=[{"role": "user", "content": "q"}]), rollout_id="r"
    )
    assert trajectory.to_json_dict()["final_metrics"] == {"total_steps": 1}


def test_report_ignores_unknown_keys_at_every_level() -> None:
    report = TrajectoryReport.model_validate(
        {
            "model_name": "m",
            "version": 3,
            "samples": {
                "s": {
                    "llm_call_metrics": [{"prompt_tokens": 1, "latency_ms": 12}],
                    "trace_id": "t",
                    "final_metrics": {"total_prompt_tokens": 1, "wall_time": 3},
                }
            },
        }
    )
    (sample,) = report.samples.values()
    assert sample.llm_call_metrics == [LlmCallMetrics(prompt_tokens=1)]
    trajectory = convert_sample_to_trajectory(
        RolloutSample(messages=[{"role": "assistant", "content": ""}]),
        rollout_id="r",
        report=report,
    )
    assert trajectory.to_json_dict()["final_metrics"] == {
        "total_prompt_tokens": 1,
        "total_steps": 1,
    }


def test_report_rejects_non_finite_numbers() -> None:
    with pytest.raises(ValidationError):
        LlmCallMetrics(cost_usd=math.nan)
    with pytest.raises(ValidationError):
        LlmCallMetrics.model_validate({"logprobs": [-0.1, -math.inf]})
