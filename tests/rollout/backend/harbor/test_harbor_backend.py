"""HarborBackend end to end: real Harbor trials in bubblewrap sandboxes, a real rollout
server, and the embedded model behind a real gateway."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from harbor_rollout import AnsweredAtAll, AskConfig, AskTheModel, Narrate

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout import ExecutionRequest, RolloutContext
from osmosis_ai.rollout.backend.harbor import HarborBackend
from osmosis_ai.rollout.container import INPUT_FILE
from tests.rollout.backend.harbor.conftest import (
    PROJECT,
    PROMPT,
    ServeHarbor,
    bubblewrap,
    write_task,
)

# The gateway fixture lives on the module's event loop; the tests must run on it too.
pytestmark = pytest.mark.asyncio(loop_scope="module")

CONFIG = AskConfig(name="ask", max_tokens=16)
REWARD_QUARTER = "echo 0.25 > /logs/verifier/reward.txt\n"
HELLO_CHECK = """\
grep -q hello /app/hello.txt 2>/dev/null && reward=1 || reward=0
echo $reward > /logs/verifier/reward.txt
"""


def _workflow(tasks_dir: Path, **kwargs: Any) -> dict[str, Any]:
    return {
        "tasks_dir": tasks_dir,
        "agent": AskTheModel,
        "workflow_config": CONFIG,
        "grader": AnsweredAtAll,
        "code_dir": PROJECT,
        **kwargs,
    }


def _files(*roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()]


async def test_template_task_runs_the_bundled_workflow_and_grader(
    serve_harbor: ServeHarbor, tmp_path: Path, artifact_root: Path
) -> None:
    tasks = write_task(tmp_path, "ask")
    async with serve_harbor(**_workflow(tasks)) as served:
        result = await served.run("h-template", label="hello")
    assert result.status == "success", result.err_message
    assert result.sample.reward == 1.0
    messages = result.sample.messages
    assert messages[0] == {"role": "user", "content": "Say hello."}
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"]
    assert result.sample.metrics["label_seen"] == 1.0  # the grader saw the label
    rollout = artifact_root / "h-template"
    assert (rollout / "artifacts" / "answer.txt").read_text() == messages[-1]["content"]
    assert (rollout / "artifacts" / "where.txt").read_text() == "/app"  # ran in the sandbox
    agent_input = json.loads((rollout / "logs" / "agent" / "container_input.json").read_text())
    assert agent_input["label"] is None and agent_input["api_key"] is None
    assert (rollout / "logs" / "verifier" / "reward.json").exists()
    assert (rollout / "trajectory.json").exists()
    # The gateway saw the rollout's call: the workflow really reached it from the sandbox.
    assert served.gateway.records.calls("h-template")


async def test_task_tests_win_over_the_grader(serve_harbor: ServeHarbor, tmp_path: Path) -> None:
    tasks = write_task(tmp_path, "own-tests", test_sh=REWARD_QUARTER)
    async with serve_harbor(**_workflow(tasks)) as served:
        result = await served.run("h-own-tests", label="hello")
    assert result.status == "success", result.err_message
    assert result.sample.reward == 0.25


async def test_a_task_without_reward_source_says_so(
    serve_harbor: ServeHarbor, tmp_path: Path
) -> None:
    tasks = write_task(tmp_path, "no-tests")
    async with serve_harbor(**_workflow(tasks, grader=None)) as served:
        result = await served.run("h-no-reward", label="hello")
    assert result.status == "failure" and result.err_category == "validation_error"
    assert "no reward source" in str(result.err_message)
    assert result.sample is not None  # the workflow's sample is kept


async def test_oracle_runs_the_reference_solution(
    serve_harbor: ServeHarbor, tmp_path: Path
) -> None:
    tasks = write_task(
        tmp_path,
        "hello-file",
        instruction="Create /app/hello.txt containing hello.",
        solve_sh="echo hello > /app/hello.txt\n",
        test_sh=HELLO_CHECK,
    )
    async with serve_harbor(tasks_dir=tasks, agent="oracle", task_mode="template") as served:
        result = await served.run("h-oracle", label="x")
    assert result.status == "success", result.err_message
    assert result.sample.reward == 1.0
    assert result.sample.extra_fields["trainable"] is False


# An agent loop on the embedded model: ~60 s beside CI's other phases, and once past the
# default 120 s when the model's threads stalled there (see tests/conftest.py).
@pytest.mark.timeout(300)
async def test_mini_swe_agent_on_the_embedded_model(
    serve_harbor: ServeHarbor, tmp_path: Path, artifact_root: Path
) -> None:
    tasks = write_task(tmp_path, "hello-shell", test_sh=HELLO_CHECK)
    instruction = [{"role": "user", "content": "Run: echo hello > /app/hello.txt"}]
    async with serve_harbor(
        tasks_dir=tasks,
        agent="mini-swe-agent",
        native_agent_kwargs={"config": {"agent": {"step_limit": 2}}},
        server_options={"previews": True, "preview_interval_sec": 0.2},
    ) as served:
        handle = await served.client.run_rollout(
            instruction,
            served.gateway.chat_completions_url("h-mini"),
            "h-mini",
            llm_api_key=served.gateway.token,
            label="x",
        )
        result = await handle
        preview = await handle.preview()
    # The tiny model may or may not solve it; the trajectory and the reward come back.
    assert result.status == "success", result.err_message
    assert result.sample is not None and result.sample.reward in (0.0, 1.0)
    roles = [m["role"] for m in result.sample.messages]
    assert "assistant" in roles and "user" in roles
    assert served.gateway.records.calls("h-mini")  # mini-swe-agent called the gateway
    assert (artifact_root / "h-mini" / "logs" / "agent" / "trajectory.json").exists()
    # Previews came from mini-swe-agent's own trajectory file, redacted like any other.
    assert preview is not None and len(preview["steps"]) >= 2
    assert served.gateway.token not in json.dumps(preview)


async def test_a_native_agent_graded_by_a_bundled_grader(
    serve_harbor: ServeHarbor, tmp_path: Path
) -> None:
    tasks = write_task(tmp_path, "no-tests")  # no tests/test.sh: the grader decides
    async with serve_harbor(
        tasks_dir=tasks,
        agent="mini-swe-agent",
        grader=AnsweredAtAll,
        code_dir=PROJECT,
        native_agent_kwargs={"config": {"agent": {"step_limit": 1}}},
    ) as served:
        result = await served.run("h-mini-graded", label="x")
    assert result.status == "success", result.err_message
    assert result.sample is not None and result.sample.reward in (0.0, 1.0)
    assert result.sample.metrics["label_seen"] == 1.0  # our grader ran, on ATIF messages


async def test_cancellation_stops_the_trial(tmp_path: Path, artifact_root: Path) -> None:
    tasks = write_task(tmp_path, "slow")
    backend = HarborBackend(
        **_workflow(tasks, grader=None),
        environment_config=bubblewrap(),
        container_python=sys.executable,
        trials_dir=tmp_path / "trials",
    )
    # /logs/agent is the trial's agent directory, visible on the host while the trial runs.
    metadata = {"sleep": 60, "started": "/logs/agent/started"}
    request = ExecutionRequest(id="h-cancel", prompt=[], metadata=metadata)
    context = RolloutContext(
        chat_completions_url="http://127.0.0.1:9/v1",
        api_key="sk-cancel-canary",
        rollout_id="h-cancel",
    )

    async def run() -> object:
        with context:
            return await backend.execute(request)

    task = asyncio.create_task(run())
    started = tmp_path / "trials" / "trial-h-cancel" / "agent" / "started"
    async with asyncio.timeout(60):
        while not started.exists():  # noqa: ASYNC110 -- the workflow in the sandbox writes it
            await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not any((tmp_path / "trials" / "rollouts").iterdir())  # staging removed
    leftovers = [p for p in _files(tmp_path / "trials") if b"sk-cancel-canary" in p.read_bytes()]
    assert leftovers == []


async def test_the_rollout_key_is_absent_from_every_kept_file(
    serve_harbor: ServeHarbor, tmp_path: Path, artifact_root: Path
) -> None:
    tasks = write_task(tmp_path, "leaky")
    async with serve_harbor(
        **_workflow(tasks, cleanup_successful_trials=False), trials_dir=tmp_path / "kept-trials"
    ) as served:
        key = served.gateway.token
        result = await served.run("h-leak", label="hello", metadata={"leak_key": True})
    assert result.status == "success", result.err_message
    kept = _files(artifact_root, tmp_path / "kept-trials")
    assert len(kept) > 10
    assert [p for p in kept if key.encode() in p.read_bytes()] == []
    # The key the agent echoed was replaced, not silently dropped with its file.
    answer = (artifact_root / "h-leak" / "artifacts" / "answer.txt").read_text()
    assert "[REDACTED]" in answer


async def test_the_rollout_deadlines_reach_the_sandboxed_runner(
    serve_harbor: ServeHarbor, tmp_path: Path
) -> None:
    # The in-container runner enforces (and reports) the deadlines only if it receives them.
    tasks = write_task(tmp_path, "deadlines")
    async with serve_harbor(
        **_workflow(tasks, cleanup_successful_trials=False), trials_dir=tmp_path / "kept"
    ) as served:
        result = await served.run(
            "h-deadlines", label="hello", agent_timeout_sec=120, grader_timeout_sec=60
        )
    assert result.status == "success", result.err_message
    sent = json.loads((tmp_path / "kept" / "trial-h-deadlines" / "agent" / INPUT_FILE).read_text())
    assert sent["agent_timeout_sec"] == 120
    assert sent["grader_timeout_sec"] == 60
    assert sent["label"] is None  # the agent never sees the ground truth


async def test_previews_flow_from_the_sandboxed_workflow(
    serve_harbor: ServeHarbor, tmp_path: Path
) -> None:
    tasks = write_task(tmp_path, "narrate")
    async with serve_harbor(
        tasks_dir=tasks,
        agent=Narrate,
        code_dir=PROJECT,
        preview_interval_sec=0.2,
        server_options={"previews": True, "preview_interval_sec": 0.2},
    ) as served:
        handle = await served.client.run_rollout(
            PROMPT,
            served.gateway.chat_completions_url("h-preview"),
            "h-preview",
            llm_api_key=served.gateway.token,
            grade=False,
        )
        seen: list[str] = []
        async with asyncio.timeout(60):
            while not handle.done():
                preview = await handle.preview()
                if preview is not None and preview["extra"]["osmosis"]["status"] == "running":
                    seen.extend(step.get("message", "") for step in preview["steps"])
                await asyncio.sleep(0.1)
            result = await handle
    assert result.status == "success", result.err_message
    assert "Say hello." in seen and any(m.startswith("turn ") for m in seen)


async def test_dataset_mode_picks_the_task_and_refuses_escapes(
    serve_harbor: ServeHarbor, tmp_path: Path
) -> None:
    root = tmp_path / "dataset"
    write_task(root, "quarter", test_sh=REWARD_QUARTER)
    async with serve_harbor(**_workflow(root, task_mode="dataset")) as served:
        picked = await served.run("h-pick", label="x", metadata={"harbor_task_id": "quarter"})
        escaped = await served.run("h-escape", label="x", metadata={"harbor_task_id": "../x"})
    assert picked.status == "success", (picked.err_category, picked.err_message)
    assert picked.sample.reward == 0.25
    assert escaped.status == "failure" and escaped.err_category == "validation_error"
    assert "harbor_task_id" in escaped.err_message


async def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    tasks = write_task(tmp_path, "t")
    with pytest.raises(ConfigError, match="native_agent_kwargs"):
        HarborBackend(tasks_dir=tasks, agent=AskTheModel, native_agent_kwargs={"x": 1})
    with pytest.raises(ConfigError, match="max_queue_depth"):
        HarborBackend(tasks_dir=tasks, agent="oracle", max_queue_depth=0)
    with pytest.raises(ConfigError, match="tasks_dir"):
        HarborBackend(tasks_dir=tmp_path / "missing", agent="oracle")
    with pytest.raises(ConfigError, match="task_mode"):
        HarborBackend(tasks_dir=tasks, agent="oracle", task_mode="pool")  # type: ignore[arg-type]


async def test_admission_stops_at_max_queue_depth(tmp_path: Path) -> None:
    backend = HarborBackend(
        tasks_dir=write_task(tmp_path, "narrate"),
        agent=Narrate,
        code_dir=PROJECT,
        environment_config=bubblewrap(),
        container_python=sys.executable,
        trials_dir=tmp_path / "trials",
        n_concurrent=1,
        max_queue_depth=1,
    )

    async def run(rollout_id: str) -> Any:
        request = ExecutionRequest(id=rollout_id, prompt=PROMPT, grade=False)
        with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1", rollout_id=rollout_id):
            return await backend.execute(request)

    assert backend.has_capacity()
    first = asyncio.create_task(run("h-q1"))
    second = asyncio.create_task(run("h-q2"))
    async with asyncio.timeout(60):
        while backend.health()["harbor"] != {  # noqa: ASYNC110 -- Harbor's hooks update it
            "queued": 1, "running": 1, "max_queue_depth": 1, "agent": "workflow",
        }:  # fmt: skip
            await asyncio.sleep(0.05)
    assert not backend.has_capacity()
    outcomes = await asyncio.gather(first, second)
    assert all(o.result.ok for o in outcomes), [o.result.err_message for o in outcomes]
    assert backend.has_capacity()
