"""ProcessBackend with real child processes: deadlines, crashes, memory, sandbox, previews."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai._serving import running_server
from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout import (
    ExecutionOutcome,
    ExecutionRequest,
    LocalBackend,
    RolloutContext,
    RolloutErrorCategory,
    RolloutStatus,
)
from osmosis_ai.rollout.backend.process import ProcessBackend
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.testing import ChatStub, StubReply
from tests.rollout.backend.process_workflows import Behave, GraderSettings, Match, Settings

PROMPT = [{"role": "user", "content": "What is 6*7?"}]
KEY = "sk-process-canary-5e1f0c"


def _request(rollout_id: str, kind: str = "answer", *, timeout: float | None = 20, **meta: Any):
    return ExecutionRequest(
        id=rollout_id,
        prompt=PROMPT,
        label="42",
        metadata={"kind": kind, **meta},
        agent_timeout_sec=timeout,
        grader_timeout_sec=timeout,
    )


async def _execute(backend: ProcessBackend, request: ExecutionRequest, url: str = "") -> Any:
    with RolloutContext(chat_completions_url=url, api_key=KEY, rollout_id=request.id):
        return await backend.execute(request)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; only its parent can still reap it.
    status = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    return status != "Z"


def _pids(artifact_root: Path, rollout_id: str) -> list[int]:
    text = (artifact_root / rollout_id / "artifacts" / "pids").read_text()
    return [int(pid) for pid in text.split()]


@pytest.fixture
async def pooled(artifact_root: Path) -> AsyncIterator[ProcessBackend]:
    backend = ProcessBackend(
        workflow=Behave,
        workflow_config=Settings(name="calc"),
        grader=Match,
        memory_limit_mb=1024,
        kill_grace_sec=0.3,
    )
    yield backend
    await backend.shutdown()


@pytest.fixture
async def sandboxed(artifact_root: Path) -> AsyncIterator[ProcessBackend]:
    backend = ProcessBackend(workflow=Behave, grader=Match, sandbox=True, kill_grace_sec=0.3)
    yield backend
    await backend.shutdown()


async def test_workflow_and_grader_run_with_their_configs(artifact_root: Path) -> None:
    backend = ProcessBackend(
        workflow=Behave,
        workflow_config=Settings(name="calc", answer="7"),
        grader=Match,
        grader_config=GraderSettings(name="match", bonus=0.5),
    )
    try:
        outcome = await _execute(backend, _request("r-configs"))
    finally:
        await backend.shutdown()
    result = outcome.result
    assert result.ok, result.err_message
    assert result.sample.messages[-1]["content"] == "7"
    assert result.sample.label == "42"
    assert result.sample.reward == 0.5  # wrong answer (0) plus the configured bonus
    assert outcome.workflow.ok and outcome.grader is not None


@pytest.mark.parametrize("kind", ["spin", "sleep_with_child", "async_sleep"])
async def test_deadline_ends_the_rollout_within_a_second(
    pooled: ProcessBackend, artifact_root: Path, kind: str
) -> None:
    started = time.monotonic()
    outcome = await _execute(pooled, _request(f"r-{kind}", kind, timeout=1.5))
    elapsed = time.monotonic() - started
    result = outcome.result
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.TIMEOUT
    assert "1.5s deadline" in result.err_message
    assert elapsed <= 1.5 + 1.0, elapsed
    pids = _pids(artifact_root, f"r-{kind}")
    async with asyncio.timeout(5):
        while any(_alive(pid) for pid in pids):  # noqa: ASYNC110 -- other processes
            await asyncio.sleep(0.05)


async def test_grader_deadline_kills_the_grader(pooled: ProcessBackend) -> None:
    started = time.monotonic()
    outcome = await _execute(pooled, _request("r-grader-spin", grade="spin", timeout=1.0))
    assert time.monotonic() - started < 1.0 + 1.0 + 1.0  # workflow time + grader deadline + 1
    assert outcome.workflow.ok
    assert outcome.result.err_category is RolloutErrorCategory.TIMEOUT
    assert outcome.result.err_message.startswith("grader exceeded its 1s deadline")


async def test_crashes_fail_only_their_own_rollout(pooled: ProcessBackend) -> None:
    segfault, exited, healthy = await asyncio.gather(
        _execute(pooled, _request("r-segv", "segfault")),
        _execute(pooled, _request("r-exit", "exit")),
        _execute(pooled, _request("r-ok")),
    )
    assert segfault.result.err_category is RolloutErrorCategory.AGENT_ERROR
    assert "SIGSEGV" in segfault.result.err_message
    assert segfault.result.extra_fields["signal"] == 11
    assert "Fatal Python error" in segfault.result.extra_fields["output_tail"]
    assert exited.result.err_category is RolloutErrorCategory.AGENT_ERROR
    assert "exited with status 3" in exited.result.err_message
    assert healthy.result.ok and healthy.result.sample.reward == 1.0


async def test_memory_hog_hits_its_cap(pooled: ProcessBackend) -> None:
    outcome = await _execute(pooled, _request("r-hog", "hog"))
    result = outcome.result
    assert result.status is RolloutStatus.FAILURE
    assert "memory cap of 1024 MiB" in result.err_message
    assert result.extra_fields["memory_limit_bytes"] == 1024 * 2**20


@pytest.mark.parametrize("kind", ["raise", "answer"])
async def test_results_match_in_process_execution(pooled: ProcessBackend, kind: str) -> None:
    local = LocalBackend(workflow=Behave, workflow_config=Settings(name="calc"), grader=Match)
    expected = await _execute(local, _request(f"r-local-{kind}", kind))  # type: ignore[arg-type]
    actual = await _execute(pooled, _request(f"r-proc-{kind}", kind))
    for field in ("status", "err_message", "err_category"):
        assert getattr(actual.result, field) == getattr(expected.result, field)
    if expected.result.sample is not None:
        assert actual.result.sample.model_dump() == expected.result.sample.model_dump()


async def _wait_for_pids(artifact_root: Path, rollout_id: str) -> None:
    """Until the rollout's child wrote its pid (it is then running the workflow)."""
    pids_file = artifact_root / rollout_id / "artifacts" / "pids"
    async with asyncio.timeout(10):
        while not pids_file.exists() or not pids_file.read_text():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def test_cancellation_kills_the_child(pooled: ProcessBackend, artifact_root: Path) -> None:
    task = asyncio.create_task(_execute(pooled, _request("r-cancel", "sleep", timeout=None)))
    await _wait_for_pids(artifact_root, "r-cancel")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [pid] = _pids(artifact_root, "r-cancel")
    async with asyncio.timeout(5):
        while _alive(pid):  # noqa: ASYNC110 -- another process
            await asyncio.sleep(0.05)
    assert pooled._root is not None and not any((pooled._root / "rollouts").iterdir())


async def test_a_dead_pool_fails_its_rollouts_and_restarts(
    pooled: ProcessBackend, artifact_root: Path
) -> None:
    running = asyncio.create_task(_execute(pooled, _request("r-orphan", "sleep", timeout=None)))
    await _wait_for_pids(artifact_root, "r-orphan")  # the pool's child is running the rollout
    pool_pid = pooled.health()["process"]["pool_pid"]
    os.kill(pool_pid, 9)
    async with asyncio.timeout(10):
        orphaned: ExecutionOutcome = await running
    assert orphaned.result.err_category is RolloutErrorCategory.INTERNAL_ERROR
    assert "process pool died" in str(orphaned.result.err_message)
    again = await _execute(pooled, _request("r-after"))
    assert again.result.ok
    assert pooled.health()["process"]["pool_pid"] not in (None, pool_pid)


async def test_capacity_is_bounded_by_max_processes(artifact_root: Path) -> None:
    backend = ProcessBackend(workflow=Behave, max_processes=1)
    try:
        await backend.start()
        assert backend.has_capacity()
        task = asyncio.create_task(_execute(backend, _request("r-busy", "async_sleep", timeout=2)))
        async with asyncio.timeout(5):
            while backend.has_capacity():  # noqa: ASYNC110 -- a slot taken by the task
                await asyncio.sleep(0.01)
        assert backend.health()["concurrency"]["running"] == 1
        await task
        assert backend.has_capacity()
    finally:
        await backend.shutdown()


async def test_key_reaches_the_child_only_through_its_environment(
    pooled: ProcessBackend,
) -> None:
    async with ChatStub() as stub:
        stub.push(StubReply(content="42"))
        outcome = await _execute(pooled, _request("r-chat", "chat"), url=stub.base_url)
    assert outcome.result.ok, outcome.result.err_message
    assert stub.requests[0]["headers"]["authorization"] == f"Bearer {KEY}"


def test_bad_configuration_is_refused_at_construction(artifact_root: Path) -> None:
    class Local(Behave):  # defined in a function: a child cannot import it
        pass

    with pytest.raises(ConfigError, match="defined inside a function"):
        ProcessBackend(workflow=Local)
    with pytest.raises(ConfigError, match="sandbox"):
        ProcessBackend(workflow=Behave, sandbox=True, warm_pool=True)
    with pytest.raises(ConfigError, match="memory_limit_mb"):
        ProcessBackend(workflow=Behave, memory_limit_mb=1)


class TestSandbox:
    async def test_writes_outside_the_artifacts_dir_fail(
        self, sandboxed: ProcessBackend, tmp_path: Path, artifact_root: Path
    ) -> None:
        outside = Path(__file__).with_name(f"escaped-{os.getpid()}.txt")  # host userland
        escaped = await _execute(sandboxed, _request("r-escape", "write", path=str(outside)))
        assert escaped.result.err_category is RolloutErrorCategory.AGENT_ERROR
        assert "Read-only file system" in escaped.result.err_message
        assert not outside.exists()
        # /tmp is private: the write succeeds inside and never reaches the host's /tmp.
        private = tmp_path / "scratch.txt"
        hidden = await _execute(sandboxed, _request("r-tmp", "write", path=str(private)))
        assert hidden.result.ok, hidden.result.err_message
        assert not private.exists()
        kept = await _execute(sandboxed, _request("r-artifact", "artifact"))
        assert kept.result.ok, kept.result.err_message
        assert (artifact_root / "r-artifact" / "artifacts" / "note.txt").read_text() == "kept"

    async def test_deadline_and_crash(self, sandboxed: ProcessBackend) -> None:
        started = time.monotonic()
        spun, crashed = await asyncio.gather(
            _execute(sandboxed, _request("r-sb-spin", "spin", timeout=2)),
            _execute(sandboxed, _request("r-sb-segv", "segfault")),
        )
        assert time.monotonic() - started <= 2 + 1.0
        assert spun.result.err_category is RolloutErrorCategory.TIMEOUT
        assert "SIGSEGV" in crashed.result.err_message

    async def test_only_the_gateway_is_reachable(self, sandboxed: ProcessBackend) -> None:
        other = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        address = other.sockets[0].getsockname()[:2]
        try:
            async with ChatStub() as stub:
                stub.push(StubReply(content="42"))
                url = stub.base_url
                chat = await _execute(sandboxed, _request("r-sb-chat", "chat"), url=url)
                probe = await _execute(
                    sandboxed, _request("r-sb-probe", "connect", address=list(address)), url=url
                )
        finally:
            other.close()
        assert chat.result.ok, chat.result.err_message
        assert chat.result.sample.messages[-1]["content"] == "42"
        assert probe.result.sample.messages[-1]["content"].startswith("unreachable")


async def test_previews_flow_from_the_child(artifact_root: Path) -> None:
    backend = ProcessBackend(workflow=Behave, preview_interval_sec=0.1)
    app = create_rollout_server(
        backend=backend, configure_logging=False, previews=True, preview_interval_sec=0.1
    )
    seen: list[str] = []
    async with running_server(app) as running, RolloutClient(url=running.base_url) as client:
        handle = await client.run_rollout(
            PROMPT,
            "http://127.0.0.1:9/v1",
            "r-preview",
            llm_api_key=KEY,
            metadata={"kind": "talk", "turns": 4, "pause": 0.4},
        )
        async with asyncio.timeout(30):
            while not handle.done():
                preview = await handle.preview()
                if preview is not None:
                    seen.append(json.dumps(preview))
                await asyncio.sleep(0.1)
            result = await handle
    assert result.status == "success"
    running_previews = [json.loads(p) for p in seen if '"status": "running"' in p]
    assert running_previews, seen[-1:]
    messages = [step.get("message") for p in running_previews for step in p["steps"]]
    assert "turn 0" in messages and "What is 6*7?" in messages
    assert all(KEY not in p for p in seen)
