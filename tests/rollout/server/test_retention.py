"""Bounded memory over HTTP: results freed after delivery, tombstones, the count cap."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from osmosis_ai.rollout import LocalBackend, RolloutStatus
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.types import POLLING_LEASE_HEADER
from tests.rollout.server.conftest import CHAT_URL, PROMPT, ServeFactory, Server
from tests.rollout.server.workflows import Answer

TERMINAL = {"success", "failure", "cancelled"}


async def _admit(server: Server, rollout_id: str) -> str:
    admitted = await server.admit(rollout_id)
    assert admitted.status_code == 202, admitted.text
    token: str = admitted.json()["polling_lease_token"]
    return token


async def _poll(server: Server, rollout_id: str, token: str) -> Any:
    return await server.http.get(
        f"/rollout/{rollout_id}/result", headers={POLLING_LEASE_HEADER: token}
    )


async def _final(server: Server, rollout_id: str, token: str) -> bytes:
    """Poll until the final result; its raw body."""
    for _ in range(20):
        response = await _poll(server, rollout_id, token)
        assert response.status_code == 200, response.text
        if response.json()["status"] in TERMINAL:
            body: bytes = response.content
            return body
    raise AssertionError(f"{rollout_id} did not finish")


async def _retention(server: Server) -> dict[str, int]:
    retention: dict[str, int] = (await server.http.get("/health")).json()["retention"]
    return retention


async def _until(server: Server, condition: Callable[[dict[str, int]], bool]) -> dict[str, int]:
    """``/health``'s retention figures once they satisfy ``condition`` (within 5 s)."""
    async with asyncio.timeout(5):
        while not condition(retention := await _retention(server)):  # noqa: ASYNC110 -- swept
            await asyncio.sleep(0.05)
    return retention


async def test_a_delivered_result_is_freed_after_the_grace_then_a_poll_gets_410(
    serve: ServeFactory,
) -> None:
    async with serve(delivered_result_grace_sec=0.5, max_retained_results=50) as server:
        token = await _admit(server, "r1")
        first = await _final(server, "r1", token)
        retried = await _poll(server, "r1", token)  # a retried poll inside the grace
        held = await _retention(server)
        freed = await _until(server, lambda r: r["tombstones"] == 1)
        late = await _poll(server, "r1", token)
    assert retried.status_code == 200 and retried.content == first
    assert held == {"results": 1, "tombstones": 0, "max_retained_results": 50}
    assert freed == {"results": 0, "tombstones": 1, "max_retained_results": 50}
    assert server.state.registry.get("r1") is None
    assert late.status_code == 410
    assert late.json()["status"] == "success"
    assert (
        "freed" in late.json()["detail"] and "delivered_result_grace_sec" in late.json()["detail"]
    )


async def test_a_retained_result_keeps_neither_its_request_nor_its_key_nor_its_task(
    serve: ServeFactory,
) -> None:
    # Each request carries 20 KB; a held result that kept it (or its finished task, whose
    # coroutine holds it) would keep 200 x 20 KB here.
    blob = "x" * 20_000
    async with serve(delivered_result_grace_sec=600) as server:
        await server.client.run_rollout(PROMPT, CHAT_URL, "warm", label="42")
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for index in range(200):
                handle = await server.client.run_rollout(
                    PROMPT,
                    CHAT_URL,
                    f"big{index}",
                    label="42",
                    metadata={"blob": blob},
                    llm_api_key=f"sk-rollout-{index}-5e1d7c9a",
                )
                assert (await handle).status is RolloutStatus.SUCCESS
            await asyncio.sleep(0.1)  # the last tasks' done callbacks
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert server.state.health()["retention"]["results"] >= 200
        entry = server.state.registry.get("big0")
        assert entry is not None and entry.finished and entry.task is None
        # Not even its key: the entry's redactor is the server's again.
        assert entry.redactor is server.state.redactor
    assert held < 200 * 4_000, f"{held / 200:.0f} bytes per retained result"


async def test_every_retried_delivery_starts_the_grace_again(serve: ServeFactory) -> None:
    async with serve(delivered_result_grace_sec=1.0) as server:
        token = await _admit(server, "r1")
        first = await _final(server, "r1", token)
        retried = []
        for _ in range(10):  # 2.5 s of retries, each well inside the 1 s grace of the last
            await asyncio.sleep(0.25)
            retried.append(await _poll(server, "r1", token))
        await _until(server, lambda r: r["tombstones"] == 1)
        late = await _poll(server, "r1", token)
    assert [(r.status_code, r.content) for r in retried] == [(200, first)] * 10
    assert late.status_code == 410


async def test_an_uncollected_result_is_not_freed_by_the_grace(serve: ServeFactory) -> None:
    async with serve(delivered_result_grace_sec=0) as server:
        token = await _admit(server, "unread")
        await _until(server, lambda r: r["results"] == 1)
        await asyncio.sleep(1.2)  # a sweep or more: nothing was delivered, nothing freed
        kept = await _retention(server)
        body = await _final(server, "unread", token)
    assert kept["results"] == 1 and kept["tombstones"] == 0
    assert b'"status":"success"' in body


async def test_a_reused_id_is_refused_by_its_tombstone_until_retention_ends(
    serve: ServeFactory,
) -> None:
    async with serve(
        delivered_result_grace_sec=0,
        result_retention_sec=1.5,
        polling_lease_timeout_sec=2,
        result_wait_timeout_sec=1,
    ) as server:
        await _final(server, "r1", await _admit(server, "r1"))
        await _until(server, lambda r: r["tombstones"] == 1)
        assert server.state.registry.get("r1") is None  # only the tombstone is left
        refused = await server.admit("r1")
        await _until(server, lambda r: r["tombstones"] == 0)
        readmitted = await server.admit("r1")
    assert refused.status_code == 409
    assert refused.json() == {"detail": "rollout_id is already registered"}
    assert readmitted.status_code == 202


async def test_the_count_cap_evicts_the_oldest_tombstones_first(serve: ServeFactory) -> None:
    async with serve(delivered_result_grace_sec=0, max_retained_results=2) as server:
        for rollout_id in ("a", "b", "c", "d"):
            await _final(server, rollout_id, await _admit(server, rollout_id))
        retention = await _until(server, lambda r: r["results"] == 0)
        newest = [(await server.admit(rollout_id)).status_code for rollout_id in ("c", "d")]
        oldest = [(await server.admit(rollout_id)).status_code for rollout_id in ("a", "b")]
    assert retention["tombstones"] == 2
    assert newest == [409, 409]
    assert oldest == [202, 202]


async def test_the_count_cap_forgets_the_oldest_uncollected_results(serve: ServeFactory) -> None:
    async with serve(max_retained_results=2) as server:
        tokens: dict[str, str] = {}
        for rollout_id in ("a", "b", "c"):  # one after the other: "a" finishes first
            tokens[rollout_id] = await _admit(server, rollout_id)
            entry = server.state.registry.get(rollout_id)
            assert entry is not None and entry.task is not None
            await asyncio.wait_for(asyncio.shield(entry.task), 5)
        async with asyncio.timeout(5):
            while server.state.registry.get("a") is not None:  # noqa: ASYNC110 -- the sweeper
                await asyncio.sleep(0.05)
        retention = await _retention(server)
        gone = await _poll(server, "a", tokens["a"])
        kept = [await _final(server, rollout_id, tokens[rollout_id]) for rollout_id in "bc"]
    assert retention["results"] == 2 and retention["tombstones"] == 0
    assert gone.status_code == 404
    assert all(b'"status":"success"' in body for body in kept)


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"max_retained_results": 0}, ValueError, "max_retained_results must be at least 1"),
        ({"max_retained_results": 2.5}, TypeError, "max_retained_results must be an int"),
        ({"max_retained_results": True}, TypeError, "max_retained_results must be an int"),
        ({"delivered_result_grace_sec": -1}, ValueError, "delivered_result_grace_sec"),
        ({"delivered_result_grace_sec": float("inf")}, ValueError, "delivered_result_grace_sec"),
    ],
)
def test_bad_retention_options_are_refused_naming_the_option(
    kwargs: dict[str, Any], error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        create_rollout_server(backend=LocalBackend(workflow=Answer), **kwargs)
