"""The ATIF v1.7 models: what a valid trajectory document is (reference section 4.2)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from osmosis_ai.rollout.trajectory.atif import (
    ContentPart,
    FinalMetrics,
    Metrics,
    Step,
    SubagentTrajectoryRef,
    Trajectory,
)

AGENT = {"name": "osmosis-rollout-sdk", "version": "1.0"}


def document(*steps: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"agent": AGENT, "steps": list(steps), **fields}


def user_step(step_id: int = 1, **fields: Any) -> dict[str, Any]:
    return {"step_id": step_id, "source": "user", "message": "hi", **fields}


def agent_step(step_id: int = 1, **fields: Any) -> dict[str, Any]:
    return {"step_id": step_id, "source": "agent", "message": "", **fields}


def test_minimal_document_is_valid_and_dumps_without_nulls() -> None:
    trajectory = Trajectory.model_validate(document(user_step()))
    assert trajectory.schema_version == "ATIF-v1.7"
    assert trajectory.to_json_dict() == {
        "schema_version": "ATIF-v1.7",
        "agent": AGENT,
        "steps": [{"step_id": 1, "source": "user", "message": "hi"}],
    }


def test_full_document_round_trips_through_json_dict() -> None:
    full = document(
        {"step_id": 1, "source": "system", "message": "sys", "is_copied_context": True},
        agent_step(
            2,
            timestamp="2024-01-01T00:00:00Z",
            model_name="m",
            reasoning_effort="high",
            reasoning_content="r",
            tool_calls=[{"tool_call_id": "t", "function_name": "f", "arguments": {"a": 1}}],
            observation={
                "results": [
                    {
                        "source_call_id": "t",
                        "content": [{"type": "text", "text": "x"}],
                        "subagent_trajectory_ref": [{"trajectory_id": "sub-1"}],
                    }
                ]
            },
            metrics={
                "prompt_tokens": 1,
                "completion_tokens": 2,
                "cached_tokens": 0,
                "cost_usd": 0.5,
                "prompt_token_ids": [1],
                "completion_token_ids": [2, 3],
                "logprobs": [-0.5, -1.0],
                "extra": {"k": "v"},
            },
            llm_call_count=1,
            extra={"e": 1},
        ),
        schema_version="ATIF-v1.5",
        session_id="s",
        trajectory_id="t",
        notes="n",
        final_metrics={"total_prompt_tokens": 1, "total_steps": 2},
        continued_trajectory_ref="next.json",
        extra={"osmosis": {}},
        subagent_trajectories=[document(user_step(), trajectory_id="sub-1")],
    )
    dumped = Trajectory.model_validate(full).to_json_dict()
    full["subagent_trajectories"][0]["schema_version"] = "ATIF-v1.7"
    assert dumped == full


@pytest.mark.parametrize("version", ["ATIF-v1.8", "ATIF-v2.0", "1.7"])
def test_unknown_schema_version_is_rejected(version: str) -> None:
    with pytest.raises(ValidationError, match="schema_version"):
        Trajectory.model_validate(document(user_step(), schema_version=version))


@pytest.mark.parametrize(
    "where",
    [
        {"unknown": 1},
        {"agent": {**AGENT, "colour": "red"}},
        {"steps": [user_step(role="user")]},
        {"final_metrics": {"total_tokens": 3}},
    ],
    ids=["document", "agent", "step", "final-metrics"],
)
def test_unknown_keys_are_rejected(where: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        Trajectory.model_validate({**document(user_step()), **where})


@pytest.mark.parametrize(
    "metrics",
    [
        {"cost_usd": math.nan},
        {"cost_usd": math.inf},
        {"logprobs": [-0.1, -math.inf]},
    ],
)
def test_non_finite_metric_is_rejected(metrics: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="finite number"):
        Trajectory.model_validate(document(agent_step(metrics=metrics)))


def test_non_finite_final_metric_is_rejected() -> None:
    with pytest.raises(ValidationError, match="finite number"):
        FinalMetrics(total_cost_usd=math.nan)


def test_document_needs_at_least_one_step() -> None:
    with pytest.raises(ValidationError, match="at least 1 item"):
        Trajectory.model_validate(document())


@pytest.mark.parametrize("step_ids", [[2], [1, 3], [2, 1], [1, 1]])
def test_step_ids_must_be_one_to_n_in_order(step_ids: list[int]) -> None:
    steps = [user_step(step_id) for step_id in step_ids]
    with pytest.raises(ValidationError, match=r"step ids must be 1\.\.N in order"):
        Trajectory.model_validate(document(*steps))


def test_step_id_must_be_positive() -> None:
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        Step.model_validate(user_step(0))


@pytest.mark.parametrize(
    "field",
    [
        {"model_name": "m"},
        {"reasoning_effort": 0.5},
        {"reasoning_content": "r"},
        {"tool_calls": []},
        {"metrics": {}},
    ],
    ids=lambda field: next(iter(field)),
)
@pytest.mark.parametrize("source", ["user", "system"])
def test_agent_only_fields_are_rejected_on_other_steps(source: str, field: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="only allowed on agent steps"):
        Step.model_validate({**user_step(**field), "source": source})


@pytest.mark.parametrize("field", [{"metrics": {"prompt_tokens": 1}}, {"reasoning_content": "r"}])
def test_zero_llm_calls_forbid_metrics_and_reasoning(field: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="llm_call_count 0 forbids"):
        Step.model_validate(agent_step(llm_call_count=0, **field))


def test_zero_llm_calls_are_fine_without_metrics() -> None:
    assert Step.model_validate(agent_step(llm_call_count=0)).llm_call_count == 0


def test_negative_counts_are_rejected() -> None:
    with pytest.raises(ValidationError):
        Step.model_validate(agent_step(llm_call_count=-1))
    with pytest.raises(ValidationError):
        FinalMetrics(total_steps=-1)


def calls(*call_ids: str) -> list[dict[str, Any]]:
    return [
        {"tool_call_id": call_id, "function_name": "f", "arguments": {}} for call_id in call_ids
    ]


def test_observation_source_call_id_must_match_a_call_of_the_same_step() -> None:
    steps = [
        agent_step(1, tool_calls=calls("a")),
        agent_step(2, observation={"results": [{"source_call_id": "a", "content": "x"}]}),
    ]
    with pytest.raises(ValidationError, match="'a' matches no tool_call_id"):
        Trajectory.model_validate(document(*steps))


def test_observation_source_call_id_matching_the_step_is_valid() -> None:
    step = agent_step(
        tool_calls=calls("a", "b"),
        observation={"results": [{"source_call_id": "b"}, {"source_call_id": None}]},
    )
    assert Step.model_validate(step).observation is not None


def test_observation_without_source_call_id_is_valid_on_any_step() -> None:
    step = {**user_step(), "source": "system", "observation": {"results": [{"content": "r"}]}}
    assert Step.model_validate(step).observation is not None


@pytest.mark.parametrize("timestamp", ["2024-05-01T10:00:00Z", "2024-05-01T10:00:00.5+02:00"])
def test_iso_timestamps_are_accepted(timestamp: str) -> None:
    assert Step.model_validate(user_step(timestamp=timestamp)).timestamp == timestamp


def test_non_iso_timestamp_is_rejected() -> None:
    with pytest.raises(ValidationError, match="not ISO-8601"):
        Step.model_validate(user_step(timestamp="May 1st"))


@pytest.mark.parametrize(
    ("part", "error"),
    [
        ({"type": "text"}, "requires 'text'"),
        (
            {"type": "text", "text": "t", "source": {"media_type": "image/png", "path": "p"}},
            "must not have 'source'",
        ),
        ({"type": "image"}, "requires 'source'"),
        ({"type": "image", "source": {"media_type": "image/bmp", "path": "p"}}, "media_type"),
        ({"type": "audio", "text": "t"}, "type"),
    ],
)
def test_content_part_payload_must_match_its_type(part: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        ContentPart.model_validate(part)


def test_message_may_be_a_list_of_content_parts() -> None:
    parts = [
        {"type": "text", "text": "see"},
        {"type": "image", "source": {"media_type": "image/webp", "path": "a.webp"}},
    ]
    assert isinstance(Step.model_validate(user_step(message=parts)).message, list)


def test_subagent_reference_needs_an_id_or_a_path() -> None:
    with pytest.raises(ValidationError, match="needs trajectory_id or trajectory_path"):
        SubagentTrajectoryRef(session_id="s")
    assert SubagentTrajectoryRef(trajectory_path="sub.json").trajectory_path == "sub.json"


@pytest.mark.parametrize(
    ("ids", "error"),
    [([None], "needs a trajectory_id"), (["x", "x"], "duplicate subagent trajectory_id 'x'")],
)
def test_subagent_trajectories_need_unique_ids(ids: list[str | None], error: str) -> None:
    subagents = [document(user_step(), trajectory_id=sub_id) for sub_id in ids]
    with pytest.raises(ValidationError, match=error):
        Trajectory.model_validate(document(user_step(), subagent_trajectories=subagents))


def test_metrics_fields_are_all_optional() -> None:
    assert Metrics().model_dump(exclude_none=True) == {}
