"""Docker on Linux: a loopback gateway is forwarded to containers rather than refused.

Docker does not run here, so the forwarder listens on the loopback interface standing in
for the ``docker0`` bridge; the forwarding, the URL agents get and the compose overlay are
the real ones.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx2
import pytest
from harbor_rollout import AskTheModel

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout import ExecutionRequest
from osmosis_ai.rollout.backend.harbor import HarborBackend, _Paths
from osmosis_ai.testing import ChatStub, StubReply
from tests.rollout.backend.harbor.conftest import PROJECT, write_task


async def test_loopback_endpoint_is_forwarded_through_the_bridge(tmp_path: Path) -> None:
    tasks = write_task(tmp_path, "t")
    backend = HarborBackend(
        tasks_dir=tasks, agent=AskTheModel, code_dir=PROJECT, docker_bridge="lo",
        trials_dir=tmp_path / "trials",
    )  # fmt: skip
    await backend.start()
    try:
        async with ChatStub() as stub:
            stub.push(StubReply(content="forwarded"))
            url = await backend._reachable_url(f"{stub.base_url}/rollouts/r1")
            assert url.startswith("http://host.docker.internal:")
            assert url.endswith("/v1/rollouts/r1")
            port = url.split(":")[2].split("/")[0]
            async with httpx2.AsyncClient() as client:  # what a container would do
                reply = await client.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                )
            assert reply.json()["choices"][0]["message"]["content"] == "forwarded"
            staging = tmp_path / "trials" / "rollouts" / "r1"
            staging.mkdir(parents=True)
            paths = _Paths(staging=staging, trial=tmp_path / "trials" / "trial-r1")
            request = ExecutionRequest(id="r1", prompt=[{"role": "user", "content": "q"}])
            config = backend._trial_config(request, url, "sk-x", paths, time.monotonic())
        [overlay] = config.environment.extra_docker_compose
        overlay_text = Path(overlay).read_text()  # noqa: ASYNC240
        assert "host.docker.internal:host-gateway" in overlay_text
        assert config.agent.env["OSMOSIS_CHAT_COMPLETIONS_URL"] == url
    finally:
        await backend.shutdown()


async def test_without_a_docker_bridge_the_error_says_what_to_do(tmp_path: Path) -> None:
    backend = HarborBackend(
        tasks_dir=write_task(tmp_path, "t"), agent="oracle", docker_bridge="no-such-bridge0"
    )
    with pytest.raises(ConfigError, match="start Docker"):
        await backend._reachable_url("http://127.0.0.1:8000/v1/rollouts/r1")
    # Endpoints containers can reach are left alone.
    assert await backend._reachable_url("http://10.0.0.5:8000/v1") == "http://10.0.0.5:8000/v1"
