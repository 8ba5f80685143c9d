"""One connection pool to the model for all of a host's rollouts (`ModelConnectionPool`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2

from osmosis_ai._serving import running_server
from osmosis_ai.rollout import LocalBackend, RolloutContext, RolloutStatus
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.integrations.agents.strands import OsmosisStrandsAgent
from osmosis_ai.rollout.model_pool import ModelConnectionPool
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.testing import ChatStub
from tests.seed.strands_pattern import SimpleStrandsWorkflow

PROMPT: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
_ESTABLISHED = "01"


def _connections_to(stub: ChatStub) -> int:
    """Established TCP connections (IPv4, this machine) to ``stub``."""
    port = urlsplit(stub.base_url).port
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].split(":")[1], 16) == port and fields[3] == _ESTABLISHED:
            count += 1
    return count


async def test_a_servers_rollouts_share_connections_and_keep_their_own_keys(
    stub: ChatStub,
) -> None:
    app = create_rollout_server(
        backend=LocalBackend(workflow=SimpleStrandsWorkflow), configure_logging=False
    )
    keys = [f"sk-rollout-{index}-5e1d7c9a" for index in range(3)]
    async with running_server(app) as server, RolloutClient(url=server.base_url) as client:
        for index, key in enumerate(keys):
            handle = await client.run_rollout(PROMPT, stub.base_url, f"r{index}", llm_api_key=key)
            result = await handle
            assert result.status is RolloutStatus.SUCCESS, result.err_message
        assert _connections_to(stub) == 1  # kept for the next rollout
    # Three rollouts, three clients (each closed at its rollout's end), one connection,
    # which the server closed when it stopped.
    assert len({request["peer"] for request in stub.requests}) == 1
    assert [r["headers"]["authorization"] for r in stub.requests] == [f"Bearer {k}" for k in keys]
    assert _connections_to(stub) == 0


async def _strands_rollout(stub: ChatStub, rollout_id: str, pool: ModelConnectionPool) -> None:
    with RolloutContext(
        chat_completions_url=stub.base_url,
        api_key="sk-rollout-5e1d7c9a",
        rollout_id=rollout_id,
        model_pool=pool,
    ) as rollout_ctx:
        try:
            await OsmosisStrandsAgent(messages=PROMPT, callback_handler=None).invoke_async()
        finally:
            await rollout_ctx.run_cleanups()


async def test_closing_the_pool_closes_its_connections(stub: ChatStub) -> None:
    pool = ModelConnectionPool()
    await _strands_rollout(stub, "r1", pool)
    await _strands_rollout(stub, "r2", pool)
    await pool.aclose()
    await _strands_rollout(stub, "r3", pool)
    await pool.aclose()
    first, second, third = (request["peer"] for request in stub.requests)
    assert first == second != third


async def test_a_client_closed_with_a_response_open_keeps_no_connection(stub: ChatStub) -> None:
    # A rollout cancelled in the middle of a streamed answer: its connection is busy, so it
    # is closed with the client rather than lent to the next rollout.
    pool = ModelConnectionPool()
    body = {"model": "m", "messages": PROMPT}
    first = httpx2.AsyncClient(transport=pool.transport())
    request = first.build_request("POST", f"{stub.base_url}/chat/completions", json=body)
    response = await first.send(request, stream=True)
    await first.aclose()
    assert _connections_to(stub) == 0
    await response.aclose()
    second = httpx2.AsyncClient(transport=pool.transport())
    assert (await second.post(f"{stub.base_url}/chat/completions", json=body)).is_success
    await second.aclose()
    assert _connections_to(stub) == 1  # lent again
    await pool.aclose()
    assert _connections_to(stub) == 0
    assert stub.requests[0]["peer"] != stub.requests[1]["peer"]
