"""RayBackend on a real local Ray instance, behind a real rollout server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import ray

from osmosis_ai._serving import running_server
from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout import RolloutErrorCategory, RolloutStatus
from osmosis_ai.rollout.backend.ray import RayBackend
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.server import create_rollout_server
from tests.rollout.backend.ray_workflows import ExactMatch, Remote

pytestmark = pytest.mark.slow  # left out of make test-fast

PROMPT = [{"role": "user", "content": "What is 6*7?"}]
URL = "http://127.0.0.1:9/v1"


@contextlib.asynccontextmanager
async def serving(backend: RayBackend) -> AsyncIterator[RolloutClient]:
    app = create_rollout_server(backend=backend, configure_logging=False)
    async with running_server(app) as server, RolloutClient(url=server.base_url) as client:
        yield client


def _backend(**options: Any) -> RayBackend:
    options.setdefault("num_cpus_per_actor", 0.5)
    options.setdefault("actor_concurrency", 8)
    return RayBackend(workflow=Remote, grader=ExactMatch, **options)


async def _run(client: RolloutClient, rollout_id: str, **fields: Any) -> Any:
    handle = await client.run_rollout(PROMPT, URL, rollout_id, label="42", **fields)
    async with asyncio.timeout(60):
        return await handle


async def test_rollouts_run_on_actors_and_are_graded(ray_cluster: str) -> None:
    backend = _backend(num_actors=2)
    async with serving(backend) as client:
        results = await asyncio.gather(*(_run(client, f"happy-{i}") for i in range(6)))
        health = await client.health()
    assert all(r.status is RolloutStatus.SUCCESS for r in results)
    assert all(r.sample is not None and r.sample.reward == 1.0 for r in results)
    assert len(health["ray"]["actors"]) == 2
    assert health["concurrency"]["max_concurrent"] == 16
    assert backend.health()["ray"]["actors"] == []  # the server shut the actors down


async def test_cancelling_reaches_the_rollout_on_its_actor(
    ray_cluster: str, tmp_path: Path
) -> None:
    marker = tmp_path / "cancelled"
    started = tmp_path / "started"
    metadata = {"sleep": 60, "marker": str(marker), "started": str(started)}
    async with serving(_backend(num_actors=1)) as client:
        handle = await client.run_rollout(PROMPT, URL, "to-cancel", label="42", metadata=metadata)
        async with asyncio.timeout(30):
            while not started.exists():  # noqa: ASYNC110 -- written by the actor process
                await asyncio.sleep(0.05)
        await handle.cancel()
        async with asyncio.timeout(30):
            result = await handle
        async with asyncio.timeout(10):
            while not marker.exists():  # noqa: ASYNC110 -- written by the actor process
                await asyncio.sleep(0.05)
    assert result.status is RolloutStatus.CANCELLED
    assert marker.read_text() == "cancelled on the actor"


async def test_deadline_is_enforced_on_the_actor(ray_cluster: str) -> None:
    async with serving(_backend(num_actors=1)) as client:
        result = await _run(client, "slow", metadata={"sleep": 30}, agent_timeout_sec=0.5)
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.TIMEOUT


async def test_a_killed_actor_fails_its_rollout_and_is_replaced(ray_cluster: str) -> None:
    backend = _backend(num_actors=1)
    async with serving(backend) as client:
        handle = await client.run_rollout(PROMPT, URL, "doomed", label="42", metadata={"sleep": 60})
        await handle.wait_for_running()
        async with asyncio.timeout(30):
            while not any(slot.in_flight for slot in backend._slots):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        (slot,) = backend._slots
        ray.kill(slot.actor)
        async with asyncio.timeout(60):
            result = await handle
        after = await asyncio.gather(*(_run(client, f"after-{i}") for i in range(3)))
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.INTERNAL_ERROR
    assert f"node {slot.node}" in (result.err_message or "")
    assert all(r.status is RolloutStatus.SUCCESS for r in after)


async def test_artifacts_come_back_to_the_server_root(
    ray_cluster: str, artifact_root: Path
) -> None:
    root = artifact_root
    async with serving(_backend(num_actors=1, artifact_root=root)) as client:
        result = await _run(client, "with-files", metadata={"artifact": "made on the actor"})
    assert result.status is RolloutStatus.SUCCESS
    assert (root / "with-files" / "artifacts" / "out.txt").read_text() == "made on the actor"


async def test_artifacts_over_the_bound_stay_on_their_node(
    ray_cluster: str, artifact_root: Path
) -> None:
    root = artifact_root
    backend = _backend(num_actors=1, artifact_root=root, max_artifact_bytes=4)
    async with serving(backend) as client:
        result = await _run(client, "too-big", metadata={"artifact": "more than four bytes"})
    assert result.status is RolloutStatus.SUCCESS
    assert not (root / "too-big" / "artifacts" / "out.txt").exists()
    diagnostics = json.loads((root / "too-big" / "diagnostics.json").read_text())
    assert diagnostics["artifacts_left_on_node"]
    left_behind = Path(diagnostics["artifacts_path"], "out.txt")
    assert await asyncio.to_thread(left_behind.read_text) == "more than four bytes"


def test_unreachable_cluster_is_a_clear_error(tmp_path: Path) -> None:
    code = (
        "import asyncio\n"
        "from osmosis_ai.rollout.backend.ray import RayBackend\n"
        "from tests.rollout.backend.ray_workflows import Remote\n"
        "backend = RayBackend(workflow=Remote, address='127.0.0.1:9')\n"
        "asyncio.run(backend.start())\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert run.returncode != 0
    assert (
        "ConfigError" in run.stderr and "cannot reach the Ray cluster at 127.0.0.1:9" in run.stderr
    )


async def test_actors_that_cannot_be_scheduled_fail_start_clearly(ray_cluster: str) -> None:
    backend = _backend(actor_resources={"gpu_that_is_not_here": 1}, start_timeout_sec=2)
    with pytest.raises(ConfigError, match="could not start 2 executor actor"):
        await backend.start()
    assert backend.health()["ray"]["actors"] == []
    with pytest.raises(ConfigError):  # a later start tries again (and fails again)
        await backend.start()


def test_bad_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="num_actors"):
        RayBackend(workflow=Remote, num_actors=0)
