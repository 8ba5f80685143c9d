"""AgentRollouts: a real gateway in front of ChatStub, real backends and a real rollout server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from osmosis_ai._serving import running_server
from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway import OpenAICompatiblePolicy
from osmosis_ai.rollout import LocalBackend, RolloutErrorCategory, RolloutStatus
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.testing import ChatStub
from osmosis_ai.train.algorithm.sequences import Exclusion
from osmosis_ai.train.engines import AgentRollouts, EngineRollout, EngineTask, batch_metrics
from tests.train.engines_core.workflows import Chat, Judge

PROMPT = [{"role": "user", "content": "hello"}]


@pytest.fixture
async def stub() -> AsyncIterator[ChatStub]:
    async with ChatStub() as served:
        yield served


def _policy(stub: ChatStub) -> OpenAICompatiblePolicy:
    return OpenAICompatiblePolicy(stub.base_url, token_data=True, session_header="X-Session-ID")


def _tasks(kinds: dict[str, dict[str, Any]]) -> list[EngineTask]:
    return [
        EngineTask(rid, group_id=f"g-{rid[0]}", prompt=PROMPT, label="echo", metadata=meta)
        for rid, meta in kinds.items()
    ]


def _dump(rollouts: list[EngineRollout]) -> str:
    return json.dumps([r.result.model_dump(mode="json") for r in rollouts])


async def test_a_batch_runs_graded_rollouts_with_their_own_calls(
    stub: ChatStub, tmp_path: Any
) -> None:
    tasks = _tasks({f"{g}{k}": {"turns": 1 + k} for g in "ab" for k in range(2)})
    async with AgentRollouts(
        Chat, policy=_policy(stub), grader=Judge, artifact_root=tmp_path
    ) as rollouts:
        done = await rollouts.run(tasks)
        token = rollouts.gateway.token
        left = [rollouts.gateway.records.calls(t.rollout_id) for t in tasks]
    assert [r.task for r in done] == tasks
    assert all(r.result.status is RolloutStatus.SUCCESS and r.reward == 1.0 for r in done)
    assert [len(r.calls) for r in done] == [1, 2, 1, 2]
    assert left == [[], [], [], []]  # released from the gateway once collected
    # Every call reached the upstream with its rollout's sticky session header.
    sessions = sorted(request["headers"]["x-session-id"] for request in stub.requests)
    assert sessions == ["a0", "a1", "a1", "b0", "b1", "b1"]
    for rollout in done:
        produced = [list(call.completion_token_ids or []) for call in rollout.calls]
        trained = [
            [t for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m]
            for s in rollout.sequences
        ]
        assert trained == produced and all(produced)
        assert {s.group_id for s in rollout.sequences} == {rollout.task.group_id}
        assert rollout.excluded is None and rollout.seconds > 0
    assert token not in _dump(done) and token not in json.dumps(stub.requests)
    metrics = batch_metrics(done)
    assert metrics["osmosis/rollouts"] == 4 and metrics["osmosis/reward_mean"] == 1.0
    assert metrics["osmosis/calls_per_rollout"] == 1.5 and metrics["osmosis/failed"] == 0
    assert not any(key.startswith("osmosis/excluded/") for key in metrics)


async def test_failures_deadlines_and_removed_samples_end_as_results(
    stub: ChatStub, tmp_path: Any
) -> None:
    tasks = _tasks(
        {
            "ok": {"turns": 1},
            "raise": {"kind": "raise"},
            "leak": {"kind": "leak"},
            "slow": {"kind": "sleep"},
            "removed": {"kind": "remove", "turns": 1},
        }
    )
    async with AgentRollouts(
        Chat, policy=_policy(stub), grader=Judge, agent_timeout_sec=1.0, artifact_root=tmp_path
    ) as rollouts:
        done = {r.task.rollout_id: r for r in await rollouts.run(tasks)}
        token = rollouts.gateway.token
    assert done["ok"].reward == 1.0 and done["ok"].excluded is None
    for rid, category in (
        ("raise", RolloutErrorCategory.AGENT_ERROR),
        ("leak", RolloutErrorCategory.AGENT_ERROR),
        ("slow", RolloutErrorCategory.TIMEOUT),
    ):
        failed = done[rid]
        assert failed.result.status is RolloutStatus.FAILURE, rid
        assert failed.result.err_category is category, rid
        assert failed.excluded is Exclusion.FAILED and failed.reward is None
        assert failed.sequences == []
    assert "the tool input was bad" in (done["raise"].result.err_message or "")
    assert "[REDACTED]" in (done["leak"].result.err_message or "")
    assert token not in _dump(list(done.values()))
    removed = done["removed"]
    assert removed.result.status is RolloutStatus.SUCCESS and len(removed.calls) == 1
    assert removed.excluded is Exclusion.REMOVED and removed.reward is None
    assert removed.sequences == []
    metrics = batch_metrics(list(done.values()))
    assert metrics["osmosis/failed"] == 3 and metrics["osmosis/failed/timeout"] == 1
    assert metrics["osmosis/failed/agent_error"] == 2
    assert metrics["osmosis/excluded/failed"] == 3 and metrics["osmosis/excluded/removed"] == 1
    assert metrics["osmosis/reward_mean"] == 1.0 and metrics["osmosis/rewarded"] == 1


async def test_one_sequence_realigns_a_rollouts_calls_into_one(
    stub: ChatStub, tmp_path: Any
) -> None:
    # ChatStub's prompt ids restart at 0 on every call: the second call never chains.
    tasks = _tasks({"a0": {"turns": 2}})
    async with AgentRollouts(
        Chat, policy=_policy(stub), grader=Judge, drift="realign", artifact_root=tmp_path
    ) as rollouts:
        (forked,) = await rollouts.run(tasks)
    async with AgentRollouts(
        Chat,
        policy=_policy(stub),
        grader=Judge,
        drift="realign",
        one_sequence=True,
        artifact_root=tmp_path,
    ) as rollouts:
        (joined,) = await rollouts.run(tasks)
    assert len(forked.sequences) == 2 and forked.stats.realign_dropped_tokens == 0
    (sequence,) = joined.sequences
    last = joined.calls[-1]
    # The sequence is the last call's prompt and completion; the first completion, which
    # that prompt does not hold, is cut and counted.
    assert list(sequence.token_ids) == [
        *(last.prompt_token_ids or ()),
        *(last.completion_token_ids or ()),
    ]
    assert joined.stats.drift == 1
    assert joined.stats.realign_dropped_tokens == len(joined.calls[0].completion_token_ids or ())
    assert sequence.reward == joined.reward == 1.0


async def test_the_rollout_deadline_bounds_a_rollout_without_its_own(
    stub: ChatStub, tmp_path: Any
) -> None:
    async with AgentRollouts(
        Chat, policy=_policy(stub), rollout_deadline_sec=0.5, artifact_root=tmp_path
    ) as rollouts:
        (done,) = await rollouts.run(_tasks({"slow": {"kind": "sleep"}}))
    assert done.result.err_category is RolloutErrorCategory.TIMEOUT
    assert "rollout_deadline_sec" in (done.result.err_message or "")
    assert done.excluded is Exclusion.FAILED


async def test_a_remote_rollout_server_runs_the_rollouts(stub: ChatStub, tmp_path: Any) -> None:
    backend = LocalBackend(workflow=Chat, grader=Judge, artifact_root=tmp_path)
    app = create_rollout_server(backend=backend, configure_logging=False, api_key="server-key")
    async with (
        running_server(app) as server,
        AgentRollouts(
            None, policy=_policy(stub), server_url=server.base_url, server_api_key="server-key"
        ) as rollouts,
    ):
        done = await rollouts.run(_tasks({"a0": {"turns": 2}, "raise": {"kind": "raise"}}))
    assert done[0].result.status is RolloutStatus.SUCCESS and done[0].reward == 1.0
    assert len(done[0].calls) == 2 and len(done[0].sequences) >= 1
    assert done[1].result.err_category is RolloutErrorCategory.AGENT_ERROR
    assert done[1].excluded is Exclusion.FAILED


async def test_an_unreachable_rollout_server_fails_each_rollout(stub: ChatStub) -> None:
    async with AgentRollouts(
        None, policy=_policy(stub), server_url="http://127.0.0.1:9", rollout_deadline_sec=20
    ) as rollouts:
        (done,) = await rollouts.run(_tasks({"a0": {}}))
    assert done.result.err_category is RolloutErrorCategory.INTERNAL_ERROR
    assert "rollout server" in (done.result.err_message or "")
    assert done.excluded is Exclusion.FAILED


@pytest.mark.slow
async def test_a_batch_runs_on_ray_actors(ray_cluster: str, stub: ChatStub, tmp_path: Any) -> None:
    async with AgentRollouts(
        Chat, policy=_policy(stub), grader=Judge, backend="ray", artifact_root=tmp_path
    ) as rollouts:
        done = await rollouts.run(_tasks({f"r{i}": {"turns": 2} for i in range(4)}))
    assert all(r.result.status is RolloutStatus.SUCCESS and r.reward == 1.0 for r in done)
    assert [len(r.calls) for r in done] == [2, 2, 2, 2]
    assert all(r.sequences for r in done)


def test_bad_arguments_name_the_field_and_the_fix() -> None:
    policy = OpenAICompatiblePolicy("http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError, match="workflow .* or server_url"):
        AgentRollouts(None, policy=policy)
    with pytest.raises(ConfigError, match="backend 'gpu'"):
        AgentRollouts(Chat, policy=policy, backend="gpu")
    with pytest.raises(ConfigError, match="drift must be 'fork' or 'realign'"):
        AgentRollouts(Chat, policy=policy, drift="merge")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="one_sequence=True .* pass drift='realign'"):
        AgentRollouts(Chat, policy=policy, one_sequence=True)
    with pytest.raises(ConfigError, match="max_in_flight must be at least 1"):
        AgentRollouts(Chat, policy=policy, max_in_flight=0)
    with pytest.raises(ConfigError, match="EngineTask.rollout_id"):
        EngineTask("a/b", group_id="g", prompt=PROMPT)
    with pytest.raises(ConfigError, match="prompt must be a list of message objects"):
        EngineTask("a", group_id="g", prompt="hello")  # type: ignore[arg-type]


async def test_repeated_rollout_ids_are_refused(stub: ChatStub, tmp_path: Any) -> None:
    task = EngineTask("same", group_id="g", prompt=PROMPT)
    async with AgentRollouts(Chat, policy=_policy(stub), artifact_root=tmp_path) as rollouts:
        with pytest.raises(ConfigError, match="unique within a batch"):
            await rollouts.run([task, task])
