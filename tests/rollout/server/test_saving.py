"""trajectory.json and diagnostics.json are written at the server boundary, before publishing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx2
import numpy
import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway import Gateway, OpenAICompatiblePolicy
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    GraderContext,
    LocalBackend,
    RolloutStatus,
    get_rollout_context,
)
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.storage import DURABLE_FILES_ENV
from osmosis_ai.testing import ChatStub
from tests.rollout.server.conftest import CHAT_URL, PROMPT, ServeFactory, start_server_process
from tests.rollout.server.workflows import Answer, Behaviours, ExactMatch


class CallsTheModelTwice(AgentWorkflow):
    """A raw-HTTP workflow: two chat calls through the rollout's endpoint."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        context = get_rollout_context()
        assert context is not None
        messages = list(ctx.prompt)
        headers = {"Authorization": f"Bearer {context.api_key}"}
        async with httpx2.AsyncClient() as http:
            for _ in range(2):
                response = await http.post(
                    f"{context.chat_completions_url}/chat/completions",
                    json={"model": "policy", "messages": messages},
                    headers=headers,
                )
                messages.append(response.json()["choices"][0]["message"])
        return messages


async def test_trajectory_exists_when_the_result_is_published(
    serve: ServeFactory, artifact_root: Path
) -> None:
    async with serve() as server:
        handle = await server.client.run_rollout(
            PROMPT, CHAT_URL, "saved", label="42", extra_fields={"row_index": 3}
        )
        result = await handle
        trajectory = json.loads((artifact_root / "saved" / "trajectory.json").read_text())
    assert result.status is RolloutStatus.SUCCESS
    assert trajectory["session_id"] == "saved"
    assert trajectory["extra"]["osmosis"]["reward"] == 1.0
    assert trajectory["extra"]["osmosis"]["request_extra_fields"] == {"row_index": 3}
    assert [step["source"] for step in trajectory["steps"]] == ["user", "agent"]


async def test_a_rollout_without_artifacts_leaves_only_its_trajectory(
    serve: ServeFactory, artifact_root: Path
) -> None:
    async with serve() as server:
        result = await (await server.client.run_rollout(PROMPT, CHAT_URL, "bare", label="42"))
    assert result.status is RolloutStatus.SUCCESS
    assert sorted(p.name for p in (artifact_root / "bare").iterdir()) == ["trajectory.json"]


class NumpyMetrics(ExactMatch):
    """Grades like ExactMatch and reports its scores the way NumPy code produces them."""

    async def grade(self, ctx: GraderContext) -> None:
        await super().grade(ctx)
        assert ctx.sample is not None
        # Finite values only, so nothing needs dropping: they must still be converted.
        ctx.sample.metrics.update({"score": numpy.float32(0.5), "steps": numpy.int64(3)})


async def test_numpy_metrics_keep_messages_metrics_and_trajectory(
    serve: ServeFactory, artifact_root: Path
) -> None:
    async with serve(LocalBackend(workflow=Answer, grader=NumpyMetrics)) as server:
        result = await (await server.client.run_rollout(PROMPT, CHAT_URL, "np", label="42"))
    assert result.status is RolloutStatus.SUCCESS and result.sample is not None
    assert result.sample.messages[-1] == {"role": "assistant", "content": "42"}
    assert result.sample.metrics == {"score": 0.5, "steps": 3}
    trajectory = json.loads((artifact_root / "np" / "trajectory.json").read_text())
    assert trajectory["extra"]["osmosis"]["reward"] == 1.0
    assert [step["source"] for step in trajectory["steps"]] == ["user", "agent"]


async def test_failures_write_diagnostics_without_the_key(
    serve: ServeFactory, artifact_root: Path
) -> None:
    async with serve(LocalBackend(workflow=Behaviours)) as server:
        handle = await server.client.run_rollout(
            PROMPT, CHAT_URL, "broken", metadata={"do": "leak"}, llm_api_key="sk-diag-5521"
        )
        await handle
    diagnostics = (artifact_root / "broken" / "diagnostics.json").read_text()
    assert json.loads(diagnostics)["phase"] == "workflow"
    assert "RuntimeError" in diagnostics and "sk-diag-5521" not in diagnostics
    assert not (artifact_root / "broken" / "trajectory.json").exists()


async def test_gateway_per_call_token_data_lands_in_the_trajectory(
    serve: ServeFactory, artifact_root: Path
) -> None:
    async with ChatStub() as stub:
        policy = OpenAICompatiblePolicy(stub.base_url, token_data=True)
        async with Gateway(policy) as gateway:
            backend = LocalBackend(workflow=CallsTheModelTwice, grader=ExactMatch)
            async with serve(backend) as server:
                handle = await server.client.run_rollout(
                    PROMPT,
                    gateway.chat_completions_url("calls"),
                    "calls",
                    llm_api_key=gateway.token,
                    label="42",
                    extra_fields={"trajectory_report_url": gateway.trajectory_report_url("calls")},
                )
                result = await handle
    assert result.status is RolloutStatus.SUCCESS
    assert result.sample is not None and result.sample.reward == 0.0  # the stub echoes
    trajectory = json.loads((artifact_root / "calls" / "trajectory.json").read_text())
    agent_steps = [step for step in trajectory["steps"] if step["source"] == "agent"]
    assert len(agent_steps) == 2
    for step in agent_steps:
        assert step["metrics"]["prompt_token_ids"] == list(range(7))
        assert step["metrics"]["completion_token_ids"] == [100, 101, 102, 103]
        assert step["llm_call_count"] == 1
    assert gateway.token not in (artifact_root / "calls" / "trajectory.json").read_text()


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "flushed-by-the-kernel"])
async def test_files_are_fsynced_exactly_when_the_host_asks_for_durable_files(
    artifact_root: Path, tmp_path: Path, durable: bool
) -> None:
    # strace sees the system calls themselves: nothing in the process could fake them.
    log = tmp_path / "fsyncs.log"
    process, url = await start_server_process(
        wrapper=("strace", "-f", "-qq", "-e", "trace=fsync,fdatasync", "-o", str(log)),
        env={DURABLE_FILES_ENV: "1" if durable else "0"},
    )
    health: dict[str, Any] = {}
    try:
        async with RolloutClient(url=url) as client:
            health = await client.health()
            for index in range(3):
                handle = await client.run_rollout(PROMPT, CHAT_URL, f"d{index}", label="42")
                assert (await handle).status is RolloutStatus.SUCCESS
    finally:
        # The child is strace: signal the server itself (its pid is its default instance id).
        if health:
            os.kill(int(health["instance_id"]), signal.SIGTERM)
        else:
            process.kill()
        async with asyncio.timeout(30):
            await process.wait()
    assert health["files"] == {"durable": durable}
    assert all((artifact_root / f"d{index}" / "trajectory.json").is_file() for index in range(3))
    fsyncs = [line for line in log.read_text().splitlines() if "fsync(" in line]
    # Each trajectory: the file, then its directory after the rename.
    assert len(fsyncs) == (6 if durable else 0), fsyncs


async def test_a_malformed_durable_files_setting_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(DURABLE_FILES_ENV, "yes")
    with pytest.raises(ConfigError, match="_OSMOSIS_ROLLOUT_DURABLE_FILES must be 0 or 1"):
        create_rollout_server(backend=LocalBackend(workflow=Answer))
    # An explicit argument wins over the environment.
    app = create_rollout_server(backend=LocalBackend(workflow=Answer), durable_files=True)
    assert app.state.rollout.durable_files is True
