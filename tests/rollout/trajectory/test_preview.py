"""Preview snapshots and documents: window, clipping, redaction, size cap, root checks."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.rollout import RolloutSample
from osmosis_ai.rollout.trajectory.preview import (
    MAX_PREVIEW_BYTES,
    PREVIEW_ROOT_ENV,
    encode_preview,
    preview_id_allowed,
    preview_root_from_env,
    snapshot_of,
)

CANARY = "sk-canary-4f1e9b2d7c"


def _conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for index in range(turns):
        call = {
            "id": f"call_{index}",
            "type": "function",
            "function": {"name": "f", "arguments": json.dumps({"i": index})},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{index}", "content": str(index)})
    return messages


def _document(sample: RolloutSample, **stamp: Any) -> dict[str, Any]:
    snapshot = snapshot_of(sample, secrets=(CANARY,))
    assert snapshot is not None
    stamp = {"status": "running", "version": 1, "updated_at": "now", **stamp}
    return dict(json.loads(encode_preview("r1", snapshot, **stamp)))


def test_document_shape_and_stamps() -> None:
    document = _document(RolloutSample(messages=_conversation(2)), status="grading", version=7)
    assert document["session_id"] == document["trajectory_id"] == "r1"
    osmosis = document["extra"]["osmosis"]
    assert osmosis["status"] == "grading" and osmosis["preview_version"] == 7
    assert osmosis["turn"] == 2 and osmosis["truncated"] is False and osmosis["preview"]
    agent = document["steps"][1]
    assert agent["tool_calls"] == [
        {"tool_call_id": "call_0", "function_name": "f", "arguments": {"i": 0}}
    ]
    assert agent["observation"]["results"] == [{"content": "0", "source_call_id": "call_0"}]
    assert "metrics" not in agent


def test_only_the_last_100_steps_are_kept_and_renumbered() -> None:
    sample = RolloutSample(
        messages=_conversation(150),
        extra_fields={"_preview_truncated": False, "_preview_turn": 150},
    )
    document = _document(sample)
    steps = document["steps"]
    assert len(steps) == 100 and [s["step_id"] for s in steps] == list(range(1, 101))
    assert steps[-1]["tool_calls"][0]["tool_call_id"] == "call_149"
    assert steps[-1]["extra"]["osmosis"]["original_step_id"] == 151
    assert document["extra"]["osmosis"]["truncated"] is True


def test_step_ids_are_unknown_unless_the_source_says_the_window_is_whole() -> None:
    document = _document(RolloutSample(messages=_conversation(1)))
    assert document["steps"][0]["extra"]["osmosis"]["original_step_id"] is None


def test_long_strings_wide_containers_deep_nesting_and_token_arrays_are_clipped() -> None:
    deep: Any = "bottom"
    for _ in range(30):
        deep = {"d": deep}
    messages = [
        {"role": "user", "content": "x" * 20_000},
        {
            "role": "assistant",
            "content": "ok",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {
                        "name": "f",
                        "arguments": json.dumps({"wide": list(range(2000)), "deep": deep}),
                    },
                }
            ],
        },
    ]
    document = _document(RolloutSample(messages=messages))
    user, agent = document["steps"]
    assert user["message"].endswith(" [preview truncated]") and len(user["message"]) < 16_500
    arguments = agent["tool_calls"][0]["arguments"]
    assert len(arguments["wide"]) == 1_000
    assert "[preview truncated]" in json.dumps(arguments["deep"])
    assert document["extra"]["osmosis"]["truncated"] is True


def test_canary_key_is_redacted_everywhere() -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {
            "name": "fetch",
            "arguments": json.dumps({"url": f"https://u:{CANARY}@h/x", "q": CANARY}),
        },
    }
    messages = [
        {"role": "user", "content": f"curl -H 'Authorization: Bearer {CANARY}' https://h"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": json.dumps({"api_key": "other", "echo": CANARY}),
        },
        {"role": "assistant", "content": "password=hunter2 and https://bob:pw@example.com/"},
    ]
    text = json.dumps(_document(RolloutSample(messages=messages)))
    assert CANARY not in text
    assert "hunter2" not in text and "bob:pw" not in text
    assert "[REDACTED]" in text


def test_unchanged_fingerprint_gives_no_new_snapshot() -> None:
    sample = RolloutSample(messages=_conversation(1))
    first = snapshot_of(sample, secrets=())
    assert first is not None
    assert snapshot_of(sample, secrets=(), previous=first.fingerprint) is None
    grown = RolloutSample(messages=_conversation(2))
    assert snapshot_of(grown, secrets=(), previous=first.fingerprint) is not None


def test_nothing_to_show_gives_no_snapshot() -> None:
    assert snapshot_of(RolloutSample(messages=[], trajectory_messages=None), secrets=()) is None
    assert (
        snapshot_of(
            RolloutSample(messages=[{"role": "user", "content": "x"}], trajectory_messages=[]),
            secrets=(),
        )
        is None
    )


def test_oversized_documents_keep_the_newest_steps_that_fit() -> None:
    messages = [{"role": "user", "content": f"{i} " + "y" * 15_000} for i in range(100)]
    snapshot = snapshot_of(RolloutSample(messages=messages), secrets=())
    assert snapshot is not None
    data = encode_preview("r1", snapshot, status="running", version=1, updated_at="now")
    document = json.loads(data)
    assert len(data) <= MAX_PREVIEW_BYTES
    assert 0 < len(document["steps"]) < 100 and document["extra"]["osmosis"]["truncated"]
    assert document["steps"][-1]["message"].startswith("99 ")
    assert document["steps"][0]["step_id"] == 1


def test_a_single_step_too_big_becomes_a_placeholder() -> None:
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "z" * 16_000}}
        for i in range(60)
    ]
    huge = {"role": "assistant", "content": None, "tool_calls": calls}
    snapshot = snapshot_of(RolloutSample(messages=[huge]), secrets=())
    assert snapshot is not None
    document = json.loads(
        encode_preview("r1", snapshot, status="running", version=1, updated_at="now")
    )
    assert document["steps"] == [
        {
            "step_id": 1,
            "source": "agent",
            "message": "This turn exceeds the live preview size limit.",
        }
    ]


@pytest.mark.parametrize(
    ("rollout_id", "allowed"),
    [
        ("r-1", True),
        ("a.b:c_d", True),
        ("../x", False),
        (".hidden", False),
        ("a/b", False),
        ("", False),
    ],
)
def test_preview_ids(rollout_id: str, allowed: bool) -> None:
    assert preview_id_allowed(rollout_id) is allowed


def test_preview_root_must_be_absolute_without_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert preview_root_from_env() is None
    monkeypatch.setenv(PREVIEW_ROOT_ENV, str(tmp_path / "previews"))
    assert preview_root_from_env() == tmp_path / "previews"
    (tmp_path / "link").symlink_to(tmp_path)
    monkeypatch.setenv(PREVIEW_ROOT_ENV, str(tmp_path / "link" / "previews"))
    with caplog.at_level(logging.WARNING):
        assert preview_root_from_env() is None
    assert "symlink" in caplog.text
    monkeypatch.setenv(PREVIEW_ROOT_ENV, "relative/previews")
    assert preview_root_from_env() is None
