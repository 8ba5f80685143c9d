"""Chat messages -> ATIF steps (reference section 4.3), and the reverse conversion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai import __version__
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.trajectory import (
    TrajectoryReport,
    convert_sample_to_trajectory,
    messages_from_trajectory,
)

GOLDEN = Path(__file__).parent / "golden"


def convert(messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    sample = RolloutSample(messages=messages)
    return convert_sample_to_trajectory(sample, rollout_id="r-1", **kwargs).to_json_dict()


def steps_of(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = convert(messages)["steps"]
    return steps


def only_step(message: dict[str, Any]) -> dict[str, Any]:
    (step,) = steps_of([message])
    return step


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.json")), ids=lambda path: path.stem)
def test_golden_document(path: Path) -> None:
    case = json.loads(path.read_text(encoding="utf-8"))
    report = case.get("report")
    trajectory = convert_sample_to_trajectory(
        RolloutSample(**case["sample"]),
        rollout_id=case["rollout_id"],
        request_label=case.get("request_label"),
        request_metadata=case.get("request_metadata"),
        request_extra_fields=case.get("request_extra_fields"),
        report=TrajectoryReport.model_validate(report) if report is not None else None,
    )
    expected = case["expected"]
    expected["agent"]["version"] = __version__
    assert trajectory.to_json_dict() == expected


# --- rule 1: roles ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "source"),
    [("system", "system"), ("developer", "system"), ("user", "user"), ("assistant", "agent")],
)
def test_known_roles_map_to_step_sources(role: str, source: str) -> None:
    step = only_step({"role": role, "content": "hi"})
    assert step["source"] == source
    assert "extra" not in step


def test_unknown_role_becomes_user_step_with_original_role() -> None:
    step = only_step({"role": "critic", "content": "try again"})
    assert step == {
        "step_id": 1,
        "source": "user",
        "message": "try again",
        "extra": {"original_role": "critic"},
    }


def test_missing_role_becomes_user_step() -> None:
    step = only_step({"content": "who am I"})
    assert step["source"] == "user"
    assert step["extra"] == {"original_role": "null"}


def test_step_ids_count_steps_not_messages() -> None:
    steps = steps_of(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "function": {}}]},
            {"role": "tool", "tool_call_id": "a", "content": "r"},
            {"role": "assistant", "content": "done"},
        ]
    )
    assert [step["step_id"] for step in steps] == [1, 2, 3]


# --- rule 2: content -------------------------------------------------------------------------


def test_none_content_becomes_empty_message() -> None:
    assert only_step({"role": "assistant", "content": None})["message"] == ""


def test_list_of_text_parts_is_joined_by_newlines() -> None:
    content = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    assert only_step({"role": "user", "content": content})["message"] == "one\ntwo"


def test_empty_part_list_becomes_empty_message() -> None:
    assert only_step({"role": "user", "content": []})["message"] == ""


@pytest.mark.parametrize(
    ("image_url", "media_type"),
    [
        ({"url": "data:image/png;base64,AAAA"}, "image/png"),
        ({"url": "data:image/jpg;base64,AAAA"}, "image/jpeg"),
        ({"url": "https://example.com/a/cat.JPG?size=large#top"}, "image/jpeg"),
        ("https://example.com/cat.gif", "image/gif"),
        ({"url": "/tmp/screen.webp", "detail": "low"}, "image/webp"),
    ],
)
def test_text_and_image_parts_become_content_parts(image_url: Any, media_type: str) -> None:
    content = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": image_url}]
    url = image_url["url"] if isinstance(image_url, dict) else image_url
    assert only_step({"role": "user", "content": content})["message"] == [
        {"type": "text", "text": "look"},
        {"type": "image", "source": {"media_type": media_type, "path": url}},
    ]


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/svg+xml;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/picture"}},
        {"type": "image_url", "image_url": {"detail": "low"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "text", "text": None},
        "bare string",
    ],
)
def test_unrepresentable_part_turns_whole_content_into_compact_json(part: Any) -> None:
    content = [{"type": "text", "text": "café"}, part]
    message = only_step({"role": "user", "content": content})["message"]
    assert message == json.dumps(content, ensure_ascii=False, separators=(",", ":"))
    assert "café" in message


def test_dict_content_becomes_compact_json() -> None:
    step = only_step({"role": "user", "content": {"answer": "ü", "n": 1}})
    assert step["message"] == '{"answer":"ü","n":1}'


# --- rule 3: agent steps ---------------------------------------------------------------------


def tool_call(arguments: Any) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}


@pytest.mark.parametrize(
    ("arguments", "parsed"),
    [
        ({"a": 1}, {"a": 1}),
        ('{"a": [1, 2], "b": "x"}', {"a": [1, 2], "b": "x"}),
        ("[1, 2]", {"_raw": "[1, 2]"}),
        ("{not json", {"_raw": "{not json"}),
        ('{"a": NaN}', {"_raw": '{"a": NaN}'}),
        ("", {}),
        ("   ", {}),
        (None, {}),
        (12, {"_raw": "12"}),
    ],
)
def test_tool_call_arguments_are_parsed_into_an_object(arguments: Any, parsed: Any) -> None:
    step = only_step({"role": "assistant", "content": "", "tool_calls": [tool_call(arguments)]})
    assert step["tool_calls"] == [{"tool_call_id": "c1", "function_name": "f", "arguments": parsed}]


def test_tool_call_without_id_or_name_gets_defaults() -> None:
    calls = [{"function": {"arguments": "{}"}}, {"id": "", "function": {"name": ""}}, {}]
    step = only_step({"role": "assistant", "content": "", "tool_calls": calls})
    assert step["tool_calls"] == [
        {"tool_call_id": "call_0", "function_name": "unknown", "arguments": {}},
        {"tool_call_id": "call_1", "function_name": "unknown", "arguments": {}},
        {"tool_call_id": "call_2", "function_name": "unknown", "arguments": {}},
    ]


def test_malformed_tool_call_entries_are_skipped() -> None:
    calls = ["call_x", {"id": "bad", "function": "f()"}, {"id": "ok", "function": {"name": "g"}}]
    step = only_step({"role": "assistant", "content": "", "tool_calls": calls})
    assert step["tool_calls"] == [{"tool_call_id": "ok", "function_name": "g", "arguments": {}}]


@pytest.mark.parametrize("value", ["[{...}]", {"id": "c1"}, None, []])
def test_non_list_or_empty_tool_calls_are_ignored(value: Any) -> None:
    assert "tool_calls" not in only_step({"role": "assistant", "content": "", "tool_calls": value})


def test_reasoning_content_is_copied_and_non_strings_json_encoded() -> None:
    text = only_step({"role": "assistant", "content": "", "reasoning_content": "think"})
    blocks = only_step({"role": "assistant", "content": "", "reasoning_content": [{"t": "é"}]})
    assert text["reasoning_content"] == "think"
    assert blocks["reasoning_content"] == '[{"t":"é"}]'


@pytest.mark.parametrize(
    ("fields", "model_name"),
    [
        ({"model": "m1", "model_name": "m2"}, "m1"),
        ({"model_name": "m2"}, "m2"),
        ({"model": "", "extra": {"response": {"model": "m3"}}}, "m3"),
        ({"model": 5}, None),
    ],
)
def test_model_name_comes_from_the_message(fields: dict[str, Any], model_name: str | None) -> None:
    step = only_step({"role": "assistant", "content": "", **fields})
    assert step.get("model_name") == model_name


def test_model_name_on_user_message_is_not_copied() -> None:
    assert "model_name" not in only_step({"role": "user", "content": "", "model": "m"})


# --- rule 3: usage and per-call token data ---------------------------------------------------


def metrics_of(**fields: Any) -> dict[str, Any] | None:
    step = only_step({"role": "assistant", "content": "", **fields})
    metrics: dict[str, Any] | None = step.get("metrics")
    if metrics is not None:
        assert step["llm_call_count"] == 1
    else:
        assert "llm_call_count" not in step
    return metrics


def test_usage_becomes_step_metrics_with_one_llm_call() -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 3, "cached_tokens": 4, "cost_usd": 0.5}
    assert metrics_of(usage=usage) == usage


def test_usage_falls_back_to_input_and_output_tokens() -> None:
    assert metrics_of(usage={"input_tokens": 7, "output_tokens": 2}) == {
        "prompt_tokens": 7,
        "completion_tokens": 2,
    }


def test_zero_token_counts_are_kept_not_replaced_by_fallbacks() -> None:
    usage = {"prompt_tokens": 0, "input_tokens": 9, "completion_tokens": 0, "output_tokens": 9}
    assert metrics_of(usage=usage) == {"prompt_tokens": 0, "completion_tokens": 0}


@pytest.mark.parametrize("details_key", ["prompt_tokens_details", "input_tokens_details"])
def test_cached_tokens_come_from_token_details(details_key: str) -> None:
    usage = {"prompt_tokens": 10, details_key: {"cached_tokens": 6, "audio_tokens": 0}}
    assert metrics_of(usage=usage) == {
        "prompt_tokens": 10,
        "cached_tokens": 6,
        "extra": {details_key: {"cached_tokens": 6, "audio_tokens": 0}},
    }


def test_top_level_cached_tokens_win_over_details() -> None:
    usage = {"cached_tokens": 1, "prompt_tokens_details": {"cached_tokens": 6}}
    assert metrics_of(usage=usage)["cached_tokens"] == 1  # type: ignore[index]


def test_non_empty_token_details_go_to_metrics_extra() -> None:
    usage = {
        "completion_tokens": 5,
        "completion_tokens_details": {"reasoning_tokens": 2},
        "prompt_tokens_details": {},
        "output_tokens_details": "n/a",
    }
    assert metrics_of(usage=usage) == {
        "completion_tokens": 5,
        "extra": {"completion_tokens_details": {"reasoning_tokens": 2}},
    }


def test_usage_is_read_from_extra_response() -> None:
    extra = {"response": {"model": "m", "usage": {"prompt_tokens": 1, "completion_tokens": 2}}}
    assert metrics_of(extra=extra) == {"prompt_tokens": 1, "completion_tokens": 2}


def test_integral_float_counts_are_accepted_and_junk_ignored() -> None:
    usage = {
        "prompt_tokens": 12.0,
        "completion_tokens": "3",
        "cached_tokens": True,
        "cost_usd": "1",
    }
    assert metrics_of(usage=usage) == {"prompt_tokens": 12}


@pytest.mark.parametrize("usage", [{}, {"total_tokens": 5}, "lots", None])
def test_usage_without_known_fields_gives_no_metrics(usage: Any) -> None:
    assert metrics_of(usage=usage) is None


def test_token_ids_and_logprob_list_land_in_metrics() -> None:
    metrics = metrics_of(
        usage={"prompt_tokens": 3, "completion_tokens": 2},
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=[4, 5],
        logprobs=[-0.5, 0],
    )
    assert metrics == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "prompt_token_ids": [1, 2, 3],
        "completion_token_ids": [4, 5],
        "logprobs": [-0.5, 0.0],
    }


def test_token_ids_alias_is_accepted_for_completion_token_ids() -> None:
    assert metrics_of(token_ids=[4, 5]) == {"completion_token_ids": [4, 5]}


def test_openai_logprobs_shape_becomes_a_list_of_floats() -> None:
    logprobs = {
        "content": [
            {"token": "4", "logprob": -0.01, "bytes": [52], "top_logprobs": []},
            {"token": "2", "logprob": -1, "bytes": [50], "top_logprobs": []},
        ],
        "refusal": None,
    }
    assert metrics_of(logprobs=logprobs) == {"logprobs": [-0.01, -1.0]}


def test_message_with_only_token_data_counts_as_one_llm_call() -> None:
    assert metrics_of(prompt_token_ids=[1], completion_token_ids=[2]) == {
        "prompt_token_ids": [1],
        "completion_token_ids": [2],
    }


@pytest.mark.parametrize(
    "fields",
    [
        {"prompt_token_ids": [1, "2"]},
        {"completion_token_ids": [1.5]},
        {"token_ids": "1 2 3"},
        {"prompt_token_ids": []},
        {"logprobs": [-0.1, float("nan")]},
        {"logprobs": [-0.1, float("-inf")]},
        {"logprobs": [-0.1, None]},
        {"logprobs": {"content": None}},
        {"logprobs": {"content": [{"token": "x"}]}},
    ],
)
def test_malformed_token_data_is_dropped_without_failing(fields: dict[str, Any]) -> None:
    assert metrics_of(**fields) is None


# --- rule 4: tool results --------------------------------------------------------------------


def agent_calling(*call_ids: str, content: str = "") -> dict[str, Any]:
    calls = [{"id": call_id, "function": {"name": "f", "arguments": "{}"}} for call_id in call_ids]
    return {"role": "assistant", "content": content, "tool_calls": calls}


def tool_result(call_id: str | None, content: Any = "ok") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "tool", "content": content}
    if call_id is not None:
        message["tool_call_id"] = call_id
    return message


def test_tool_result_folds_into_preceding_agent_step() -> None:
    (step,) = steps_of([agent_calling("c1", "c2"), tool_result("c1", "a"), tool_result("c2", "b")])
    assert step["observation"] == {
        "results": [
            {"source_call_id": "c1", "content": "a"},
            {"source_call_id": "c2", "content": "b"},
        ]
    }


def test_tool_result_folds_into_the_agent_step_that_made_the_call() -> None:
    steps = steps_of(
        [
            agent_calling("c1", content="first"),
            {"role": "user", "content": "meanwhile"},
            agent_calling("c2", content="second"),
            tool_result("c1", "late"),
        ]
    )
    assert steps[0]["observation"] == {"results": [{"source_call_id": "c1", "content": "late"}]}
    assert "observation" not in steps[2]


def test_reused_call_id_folds_into_the_nearest_step_with_that_id() -> None:
    steps = steps_of([agent_calling("call_0"), agent_calling("call_0"), tool_result("call_0")])
    assert "observation" not in steps[0]
    assert steps[1]["observation"]["results"][0]["source_call_id"] == "call_0"


@pytest.mark.parametrize("call_id", ["nope", None])
def test_unmatched_tool_result_folds_into_previous_agent_step_without_link(
    call_id: str | None,
) -> None:
    (step,) = steps_of([agent_calling("c1"), tool_result(call_id, "x")])
    expected: dict[str, Any] = {"content": "x"}
    if call_id is not None:
        expected["extra"] = {"tool_call_id": call_id}
    assert step["observation"] == {"results": [expected]}


@pytest.mark.parametrize("role", ["tool", "function"])
def test_tool_result_without_agent_step_becomes_system_step(role: str) -> None:
    steps = steps_of(
        [
            {"role": "user", "content": "q"},
            {"role": role, "tool_call_id": "c7", "content": "r", "created_at": 0},
        ]
    )
    assert steps[1] == {
        "step_id": 2,
        "timestamp": "1970-01-01T00:00:00+00:00",
        "source": "system",
        "message": "",
        "observation": {"results": [{"content": "r", "extra": {"tool_call_id": "c7"}}]},
        "extra": {"original_role": role},
    }


def test_tool_result_content_is_flattened_like_messages() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    (step,) = steps_of([agent_calling("c1"), tool_result("c1", parts)])
    assert step["observation"]["results"][0]["content"] == "a\nb"


def test_tool_calls_and_reasoning_on_non_agent_steps_move_to_extra() -> None:
    message = {
        "role": "user",
        "content": "replayed",
        "tool_calls": [{"id": "u1", "function": {"name": "f", "arguments": '{"x": 1}'}}],
        "reasoning_content": "hmm",
    }
    step = only_step(message)
    assert step == {
        "step_id": 1,
        "source": "user",
        "message": "replayed",
        "extra": {
            "tool_calls": [{"tool_call_id": "u1", "function_name": "f", "arguments": {"x": 1}}],
            "reasoning_content": "hmm",
        },
    }


def test_tool_calls_in_extra_do_not_capture_tool_results() -> None:
    user = {"role": "user", "content": "", "tool_calls": [{"id": "u1", "function": {}}]}
    steps = steps_of([user, tool_result("u1")])
    assert steps[1]["source"] == "system"


# --- rule 6: timestamps ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "timestamp"),
    [
        ({"created_at": 1700000000}, "2023-11-14T22:13:20+00:00"),
        ({"created_at": 1700000000.25}, "2023-11-14T22:13:20.250000+00:00"),
        ({"timestamp": "2024-01-02T03:04:05Z"}, "2024-01-02T03:04:05+00:00"),
        ({"completed_at": "2024-01-02T03:04:05+02:00"}, "2024-01-02T03:04:05+02:00"),
        ({"completed_at": "2024-01-02 03:04:05"}, "2024-01-02T03:04:05"),
        ({"extra": {"timestamp": 0}}, "1970-01-01T00:00:00+00:00"),
        ({"created_at": "yesterday", "timestamp": 1700000000}, "2023-11-14T22:13:20+00:00"),
        ({"created_at": 10**20, "completed_at": 1700000000}, "2023-11-14T22:13:20+00:00"),
        ({"created_at": True}, None),
        ({"created_at": float("nan")}, None),
    ],
)
def test_timestamp_is_the_first_parseable_time_field(
    fields: dict[str, Any], timestamp: str | None
) -> None:
    assert only_step({"role": "user", "content": "", **fields}).get("timestamp") == timestamp


# --- document-level fields -------------------------------------------------------------------


def test_document_identity_and_agent() -> None:
    document = convert([{"role": "user", "content": "hi"}], default_model_name="m-default")
    assert document["session_id"] == document["trajectory_id"] == "r-1"
    assert document["agent"] == {
        "name": "osmosis-rollout-sdk",
        "version": __version__,
        "model_name": "m-default",
    }
    assert document["final_metrics"] == {"total_steps": 1}


def test_osmosis_extra_records_sample_and_request_context() -> None:
    sample = RolloutSample(
        messages=[{"role": "user", "content": "hi"}],
        reward=0.25,
        metrics={"turns": 1},
        extra_fields={"attempt": 2},
    )
    document = convert_sample_to_trajectory(
        sample,
        rollout_id="r-9",
        request_label="gold",
        request_metadata={"task": "t"},
        request_extra_fields={"row_index": 3},
    ).to_json_dict()
    assert document["extra"] == {
        "osmosis": {
            "rollout_id": "r-9",
            "label": "gold",
            "reward": 0.25,
            "sample_metrics": {"turns": 1},
            "sample_extra_fields": {"attempt": 2},
            "request_metadata": {"task": "t"},
            "request_extra_fields": {"row_index": 3},
        }
    }


def test_sample_label_wins_and_empty_or_null_values_are_omitted() -> None:
    sample = RolloutSample(messages=[{"role": "user", "content": "hi"}], label="own")
    document = convert_sample_to_trajectory(sample, rollout_id="r", request_label="req")
    assert document.to_json_dict()["extra"] == {
        "osmosis": {"rollout_id": "r", "label": "own", "sample_metrics": {}}
    }


def test_non_json_sample_metrics_are_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sample = RolloutSample(messages=[{"role": "user", "content": "hi"}])
    sample.metrics["bad"] = float("nan")
    sample.metrics["good"] = 1
    document = convert_sample_to_trajectory(sample, rollout_id="r").to_json_dict()
    assert document["extra"]["osmosis"]["sample_metrics"] == {"good": 1}
    assert "metrics.bad" in caplog.text


def test_missing_trajectory_messages_raise_value_error() -> None:
    sample = RolloutSample(messages=[{"role": "user", "content": "hi"}], trajectory_messages=None)
    with pytest.raises(ValueError, match="no trajectory-compatible messages"):
        convert_sample_to_trajectory(sample, rollout_id="r")


def test_empty_message_list_raises_value_error() -> None:
    with pytest.raises(ValueError, match="at least one step"):
        convert_sample_to_trajectory(RolloutSample(messages=[]), rollout_id="r")


def test_conversion_does_not_modify_the_sample() -> None:
    messages = [
        agent_calling("c1"),
        tool_result("c1"),
        {"role": "assistant", "content": "", "usage": {"prompt_tokens": 1}},
    ]
    sample = RolloutSample(messages=messages)
    before = json.dumps(sample.trajectory_messages)
    report = TrajectoryReport.model_validate(
        {"samples": {"s": {"llm_call_metrics": [{"prompt_tokens": 5}, {"prompt_tokens": 6}]}}}
    )
    convert_sample_to_trajectory(sample, rollout_id="r", report=report)
    assert json.dumps(sample.trajectory_messages) == before


# --- reverse conversion ----------------------------------------------------------------------


def test_messages_from_trajectory_round_trips_chat_messages() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": "é"}'},
                }
            ],
            "reasoning_content": "adding",
        },
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
        {"role": "assistant", "content": "2"},
    ]
    assert messages_from_trajectory(convert(messages)) == messages


def test_messages_from_trajectory_restores_orphan_results_and_multimodal_parts() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}
    messages: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": "boot", "content": "ready"},
        {"role": "user", "content": [{"type": "text", "text": "see"}, image]},
        {"role": "assistant", "content": "ok"},
        {"role": "tool", "tool_call_id": "late", "content": "x"},
    ]
    assert messages_from_trajectory(convert(messages)) == messages


def test_messages_from_trajectory_returns_a_messages_document_as_is() -> None:
    messages = [{"role": "user", "content": "hi", "custom": 1}]
    assert messages_from_trajectory({"messages": messages, "steps": []}) == messages


def test_messages_from_trajectory_maps_unknown_sources_to_tool() -> None:
    document = {
        "steps": [
            {"step_id": 1, "source": "environment", "message": "boom"},
            {
                "step_id": 2,
                "source": "agent",
                "message": "",
                "tool_calls": [{"tool_call_id": "t", "function_name": "f", "arguments": {}}],
                "observation": {"results": [{"source_call_id": "t"}]},
            },
        ]
    }
    assert messages_from_trajectory(document) == [
        {"role": "tool", "content": "boom"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "t", "content": ""},
    ]


def test_messages_from_trajectory_tolerates_junk() -> None:
    assert messages_from_trajectory({"steps": "nope"}) == []
    assert messages_from_trajectory({"steps": [None, {"source": "user"}]}) == [
        {"role": "user", "content": ""}
    ]


def test_turn_rewards_sit_on_the_agent_steps_of_their_model_calls() -> None:
    """Turn i is the rollout's (i + 1)-th model call, the (i + 1)-th agent step; a turn
    without a step (more rewards than agent messages) stays in the document's list."""
    sample = RolloutSample(
        messages=[
            {"role": "user", "content": "add"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "add", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "1"},
            {"role": "assistant", "content": "1"},
        ],
        turn_rewards={0: 0.5, 1: 1.0, 4: 2.0},
    )  # fmt: skip
    document = convert_sample_to_trajectory(sample, rollout_id="r").to_json_dict()
    agent = [step for step in document["steps"] if step["source"] == "agent"]
    assert [step["extra"]["osmosis"]["turn_reward"] for step in agent] == [0.5, 1.0]
    assert document["extra"]["osmosis"]["turn_rewards"] == {"0": 0.5, "1": 1.0, "4": 2.0}
    plain = convert([{"role": "assistant", "content": "x"}])
    assert "turn_rewards" not in plain["extra"]["osmosis"]
    assert "extra" not in plain["steps"][0]
