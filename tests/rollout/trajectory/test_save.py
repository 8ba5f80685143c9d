"""Saving trajectory.json and diagnostics.json: atomic, off the event loop, never raising."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.redact import Redactor
from osmosis_ai.rollout.context import RolloutContext
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.storage import atomic_write_bytes
from osmosis_ai.rollout.trajectory import (
    TrajectoryReport,
    convert_sample_to_trajectory,
    save_diagnostics,
    save_trajectory,
)
from osmosis_ai.rollout.trajectory import save as save_module

MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 6*7?"},
    {
        "role": "assistant",
        "content": "42",
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        "prompt_token_ids": [11, 12, 13],
        "completion_token_ids": [42],
        "logprobs": [-0.125],
    },
]


def sample(messages: list[dict[str, Any]] | None = None) -> RolloutSample:
    return RolloutSample(messages=MESSAGES if messages is None else messages, label="42")


def tree(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


async def test_trajectory_is_written_under_the_rollout_directory(artifact_root: Path) -> None:
    path = await save_trajectory(
        rollout_id="r-1", sample=sample(), request_metadata={"task": "mul"}
    )
    assert path == artifact_root / "r-1" / "trajectory.json"
    expected = convert_sample_to_trajectory(
        sample(), rollout_id="r-1", request_metadata={"task": "mul"}
    ).to_json_dict()
    assert json.loads(path.read_text(encoding="utf-8")) == expected


async def test_explicit_artifact_root_wins_over_the_environment(
    tmp_path: Path, artifact_root: Path
) -> None:
    path = await save_trajectory(rollout_id="r-1", sample=sample(), artifact_root=tmp_path / "x")
    assert path == tmp_path / "x" / "r-1" / "trajectory.json"
    assert tree(artifact_root) == []


async def test_report_is_merged_into_the_saved_document(artifact_root: Path) -> None:
    report = TrajectoryReport.model_validate(
        {"model_name": "gw", "samples": {"s": {"llm_call_metrics": [{"cost_usd": 0.5}]}}}
    )
    path = await save_trajectory(rollout_id="r-1", sample=sample(), report=report)
    assert path is not None
    document = json.loads(path.read_text(encoding="utf-8"))
    assert document["agent"]["model_name"] == "gw"
    assert document["final_metrics"]["total_cost_usd"] == 0.5


async def test_file_is_indented_json_with_number_arrays_on_one_line(artifact_root: Path) -> None:
    path = await save_trajectory(rollout_id="r-1", sample=sample())
    assert path is not None
    text = path.read_text(encoding="utf-8")
    assert text.startswith('{\n  "schema_version": "ATIF-v1.7",\n')
    assert text.endswith("}\n")
    assert '\n        "prompt_token_ids": [11,12,13],\n' in text
    assert '\n        "completion_token_ids": [42],\n' in text
    assert '\n        "logprobs": [-0.125]\n' in text


async def test_non_ascii_text_is_written_as_utf8(artifact_root: Path) -> None:
    path = await save_trajectory(
        rollout_id="r-1", sample=sample([{"role": "user", "content": "¿Qué tal? 你好"}])
    )
    assert path is not None
    assert '"message": "¿Qué tal? 你好"' in path.read_text(encoding="utf-8")


async def test_write_is_atomic_and_leaves_no_temporary_files(artifact_root: Path) -> None:
    first = await save_trajectory(rollout_id="r-1", sample=sample())
    second = await save_trajectory(
        rollout_id="r-1", sample=sample([{"role": "user", "content": "again"}])
    )
    assert first == second is not None
    assert tree(artifact_root) == ["r-1", "r-1/trajectory.json"]
    assert second is not None and "again" in second.read_text(encoding="utf-8")


async def test_save_runs_off_the_event_loop(
    artifact_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The write blocks until the loop sets `release`: that can only happen if the loop
    # keeps running while the trajectory is being written.
    writing = threading.Event()
    release = threading.Event()
    writer_threads: list[int] = []
    real_write = atomic_write_bytes

    def gated_write(path: Path, data: bytes, *, durable: bool) -> None:
        writer_threads.append(threading.get_ident())
        writing.set()
        if not release.wait(timeout=10):
            raise TimeoutError("the event loop was blocked during the write")
        real_write(path, data, durable=durable)

    monkeypatch.setattr(save_module, "atomic_write_bytes", gated_write)
    task = asyncio.create_task(save_trajectory(rollout_id="r-1", sample=sample()))
    assert await asyncio.to_thread(writing.wait, 10)
    release.set()
    assert await task == artifact_root / "r-1" / "trajectory.json"
    assert writer_threads and writer_threads[0] != threading.get_ident()


async def test_nothing_is_written_without_a_sample(
    artifact_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        assert await save_trajectory(rollout_id="r-1", sample=None) is None
    assert "no sample" in caplog.text
    assert tree(artifact_root) == []


@pytest.mark.parametrize("messages", [None, []], ids=["opted-out", "empty"])
async def test_nothing_is_written_without_trajectory_messages(
    messages: list[Any] | None, artifact_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    opted_out = RolloutSample(messages=MESSAGES, trajectory_messages=messages)
    with caplog.at_level(logging.INFO):
        assert await save_trajectory(rollout_id="r-1", sample=opted_out) is None
    assert "no trajectory messages" in caplog.text
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert tree(artifact_root) == []


@pytest.mark.parametrize("rollout_id", ["../x", "a/b", "..", "", "a\\b", "a\x00b"])
async def test_unsafe_rollout_id_is_refused_without_writing(
    rollout_id: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    before = tree(tmp_path)
    assert await save_trajectory(rollout_id=rollout_id, sample=sample(), artifact_root=root) is None
    assert tree(tmp_path) == before
    assert "must be a single path segment" in caplog.text


async def test_artifact_root_that_is_a_file_gives_none_and_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "root"
    root.write_text("not a directory")
    assert await save_trajectory(rollout_id="r-1", sample=sample(), artifact_root=root) is None
    assert "trajectory of rollout 'r-1' not saved: NotADirectoryError" in caplog.text
    assert root.read_text() == "not a directory"


async def test_symlinked_trajectory_file_is_not_followed(
    tmp_path: Path, artifact_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text("keep")
    (artifact_root / "r-1").mkdir(parents=True)
    (artifact_root / "r-1" / "trajectory.json").symlink_to(outside)
    assert await save_trajectory(rollout_id="r-1", sample=sample()) is None
    assert outside.read_text() == "keep"
    assert "symlink" in caplog.text


async def test_failure_is_logged_without_message_content(
    artifact_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "sk-live-0123456789"
    leaky = sample([{"role": "user", "content": secret}])
    result = await save_trajectory(
        rollout_id="r-1", sample=leaky, request_metadata={"key": secret, "x": float("nan")}
    )
    assert result is None
    assert "not saved: ValueError" in caplog.text
    assert secret not in caplog.text
    assert not (artifact_root / "r-1" / "trajectory.json").exists()


async def test_validation_failure_is_logged_by_location_only(
    artifact_root: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-live-0123456789"

    def broken_steps(messages: Any) -> list[dict[str, Any]]:
        return [{"step_id": 1, "source": "user", "message": secret, "model_name": "m"}]

    monkeypatch.setattr(
        "osmosis_ai.rollout.trajectory.convert.chat_messages_to_steps", broken_steps
    )
    assert await save_trajectory(rollout_id="r-1", sample=sample()) is None
    assert "invalid ATIF document at steps.0" in caplog.text
    assert secret not in caplog.text


async def test_diagnostics_are_written_sorted_and_indented(artifact_root: Path) -> None:
    diagnostics = {"phase": "setup", "at": datetime.date(2024, 5, 1), "codes": [1, 2]}
    path = await save_diagnostics(rollout_id="r-1", diagnostics=diagnostics)
    assert path == artifact_root / "r-1" / "diagnostics.json"
    assert path.read_text(encoding="utf-8") == (
        '{\n  "at": "2024-05-01",\n  "codes": [\n    1,\n    2\n  ],\n  "phase": "setup"\n}\n'
    )


async def test_empty_diagnostics_write_nothing(artifact_root: Path) -> None:
    assert await save_diagnostics(rollout_id="r-1", diagnostics={}) is None
    assert tree(artifact_root) == []


async def test_diagnostics_failures_return_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert await save_diagnostics(rollout_id="../x", diagnostics={"a": 1}) is None
    assert (
        await save_diagnostics(rollout_id="r", diagnostics={"a": 1}, artifact_root=blocker) is None
    )
    mixed_keys: dict[Any, Any] = {1: "a", "b": 2}
    written = await save_diagnostics(rollout_id="r", diagnostics=mixed_keys)
    assert written is not None and json.loads(written.read_text()) == {"1": "a", "b": 2}
    assert caplog.text.count("diagnostics of rollout") == 2


async def test_default_root_is_home_dot_osmosis_without_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("_OSMOSIS_ROLLOUT_ARTIFACT_ROOT")
    path = await save_trajectory(rollout_id="r-1", sample=sample())
    assert path == Path(os.environ["HOME"]) / ".osmosis" / "r-1" / "trajectory.json"
    assert path.is_relative_to(tmp_path)


async def test_secrets_are_scrubbed_from_the_trajectory_file_and_nothing_else(
    tmp_path: Path,
) -> None:
    key = 'sk-"canary"\\9f2'
    sample = RolloutSample(
        messages=[
            {"role": "user", "content": f"my key is {key}, password: hunter2"},
            {"role": "assistant", "content": "noted", "extra": {key: "as a key"}},
        ]
    )
    path = await save_trajectory(
        rollout_id="r-secret", sample=sample, artifact_root=tmp_path, redactor=Redactor((key,))
    )
    assert path is not None
    text = path.read_text()
    assert key not in text and json.dumps(key)[1:-1] not in text
    assert "my key is [REDACTED], password: hunter2" in text  # only the secret is touched
    json.loads(text)


async def test_diagnostics_are_redacted(tmp_path: Path) -> None:
    path = await save_diagnostics(
        rollout_id="r-diag",
        diagnostics={"traceback": "Authorization: Bearer abc123", "api_key": "k", "note": "x9z"},
        artifact_root=tmp_path,
        redactor=Redactor(("x9z",)),
    )
    assert path is not None
    data = json.loads(path.read_text())
    assert data == {
        "api_key": "[REDACTED]",
        "note": "[REDACTED]",
        "traceback": "Authorization: [REDACTED] [REDACTED]",
    }


async def test_inside_a_rollout_the_files_use_the_rollout_context_redactor(tmp_path: Path) -> None:
    # No redactor argument: the running rollout's (its key plus the host's secrets) applies.
    key, configured = "sk-rollout-key-5521", "configured-secret-8830"
    leaky = sample([{"role": "user", "content": f"{key} and {configured}"}])
    with RolloutContext(api_key=key, rollout_id="r-ctx", redactor=Redactor((configured,))):
        trajectory = await save_trajectory(rollout_id="r-ctx", sample=leaky, artifact_root=tmp_path)
        diagnostics = await save_diagnostics(
            rollout_id="r-ctx", diagnostics={"note": f"{configured} {key}"}, artifact_root=tmp_path
        )
    assert trajectory is not None and diagnostics is not None
    for path in (trajectory, diagnostics):
        text = path.read_text()
        assert key not in text and configured not in text and "[REDACTED]" in text
