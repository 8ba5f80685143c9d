"""Chaos through a real rollout server and gateway: 500 rollouts with injected faults and
client disconnects during long polls. Every rollout ends with exactly one terminal result
of the expected category; no task, file descriptor or child process leaks; RSS settles."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai._serving import running_server
from osmosis_ai.gateway import Gateway
from osmosis_ai.gateway.policies.openai_compatible import OpenAICompatiblePolicy
from osmosis_ai.rollout import LocalBackend
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.testing import ChatStub, StubFailure, StubReply
from tests.reliability.workflows import Chaos

pytestmark = pytest.mark.slow  # left out of make test-fast

ROLLOUTS = 500
CONCURRENCY = 64
#: fault -> (share of rollouts, agent deadline for that row, expected (status, category)).
FAULTS: dict[str, tuple[float, float, tuple[str, str | None]]] = {
    "raise": (0.10, 30.0, ("failure", "agent_error")),
    "hang": (0.05, 0.5, ("failure", "timeout")),
    "block": (0.05, 0.1, ("failure", "timeout")),  # blocks 0.15 s (metadata block_sec)
    "upstream_5xx": (0.05, 30.0, ("failure", "agent_error")),
    "upstream_timeout": (0.05, 30.0, ("failure", "agent_error")),
}
NONE = (30.0, ("success", None))


def _plan(seed: int) -> list[str]:
    rng = random.Random(seed)
    plan = [fault for fault, (share, _, _) in FAULTS.items() for _ in range(int(ROLLOUTS * share))]
    plan += ["none"] * (ROLLOUTS - len(plan))
    rng.shuffle(plan)
    return plan


def _respond(body: dict[str, Any]) -> StubReply | StubFailure:
    text = (body.get("messages") or [{}])[-1].get("content") or ""
    if "upstream_5xx" in text:
        return StubFailure(503, message="upstream overloaded")
    if "upstream_timeout" in text:
        return StubReply(content="too late", delay_sec=12.0)  # past the policy's timeout
    return StubReply(content="ok")


@contextlib.asynccontextmanager
async def _cutting_proxy(port: int, rng: random.Random) -> AsyncIterator[tuple[int, Counter[str]]]:
    """A TCP proxy to ``port`` that drops some connections in the middle of a long poll."""
    cuts: Counter[str] = Counter()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        cut = asyncio.Event()
        polling = False  # a result long poll is waiting for its answer on this connection

        def maybe_cut() -> None:
            if polling:  # abort at once: no byte of the answer may slip through first
                writer.transport.abort()
                up_writer.transport.abort()
                cut.set()

        async def client_to_server() -> None:
            nonlocal polling
            while data := await reader.read(65536):
                if data.startswith(b"GET /rollout/") and b"/result" in data:
                    polling = True
                    if rng.random() < 0.2:
                        asyncio.get_running_loop().call_later(rng.uniform(0.01, 0.3), maybe_cut)
                up_writer.write(data)
                await up_writer.drain()

        async def server_to_client() -> None:
            nonlocal polling
            while data := await up_reader.read(65536):
                polling = False
                writer.write(data)
                await writer.drain()

        pumps = [
            asyncio.ensure_future(client_to_server()),
            asyncio.ensure_future(server_to_client()),
        ]
        cutter = asyncio.ensure_future(cut.wait())
        done, _ = await asyncio.wait([*pumps, cutter], return_when=asyncio.FIRST_COMPLETED)
        if cutter in done:
            cuts["long_poll"] += 1
        for task in [*pumps, cutter]:
            task.cancel()
        await asyncio.gather(*pumps, cutter, return_exceptions=True)
        for w in (writer, up_writer):
            w.close()
            with contextlib.suppress(Exception):
                await w.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], cuts
    finally:
        server.close()
        await server.wait_closed()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _children() -> int:
    me = str(os.getpid())
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1] == me:
                    count += 1
    return count


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def _drive(
    client: RolloutClient, gateway: Gateway, plan: list[str], prefix: str
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    queue = list(enumerate(plan))

    async def worker() -> None:
        while queue:
            index, fault = queue.pop()
            rollout_id = f"{prefix}-{index}"
            _, deadline, _ = FAULTS.get(fault, (0.0, *NONE))
            handle = await client.run_rollout(
                [{"role": "user", "content": f"fault {fault}"}],
                gateway.chat_completions_url(rollout_id),
                rollout_id,
                llm_api_key=gateway.token,
                metadata={"fault": fault, "block_sec": 0.15},
                grade=False,
                agent_timeout_sec=deadline,
            )
            assert rollout_id not in results  # exactly one terminal result per rollout
            results[rollout_id] = (fault, await handle)

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return results


@pytest.mark.timeout(300)
async def test_chaos_run_loses_nothing_and_leaks_nothing(artifact_root: Path) -> None:
    rng = random.Random(20261129)
    async with ChatStub(respond=_respond) as stub:
        # Well above the longest chain of loop-blocking faults (25 x 0.15 s): innocent calls
        # stalled by a blocked loop must not time out; the upstream_timeout fault still does.
        policy = OpenAICompatiblePolicy(base_url=stub.base_url, timeout_sec=8.0)
        app = create_rollout_server(
            backend=LocalBackend(workflow=Chaos), configure_logging=False, result_wait_timeout_sec=2
        )
        async with (
            Gateway(policy) as gateway,
            running_server(app) as server,
            _cutting_proxy(int(server.base_url.rsplit(":", 1)[1]), rng) as (port, cuts),
            RolloutClient(url=f"http://127.0.0.1:{port}") as client,
        ):
            warm = await _drive(client, gateway, ["none"] * 100, "warm")
            assert all(result.status == "success" for _, result in warm.values())
            await client.wait_idle(timeout_sec=30, poll_interval_sec=0.1)
            before = (len(asyncio.all_tasks()), _fds(), _children(), _rss_mb())

            results = await _drive(client, gateway, _plan(7), "chaos")
            await client.wait_idle(timeout_sec=30, poll_interval_sec=0.1)
            # The allocator keeps the high-water mark of the first round's peak concurrency
            # (5-25 % of RSS here, run to run): a leak shows as growth over a second round.
            rss_first_round = _rss_mb()
            again = await _drive(client, gateway, _plan(8), "again")

            await client.wait_idle(timeout_sec=30, poll_interval_sec=0.1)
            await asyncio.sleep(0.5)  # connections the proxy cut finish closing
            after = (len(asyncio.all_tasks()), _fds(), _children(), _rss_mb())

    assert len(results) == ROLLOUTS == len(again)
    results.update(again)
    wrong = [
        (rollout_id, fault, result.status, result.err_category, result.err_message)
        for rollout_id, (fault, result) in results.items()
        if (result.status, result.err_category) != FAULTS.get(fault, (0.0, *NONE))[2]
    ]
    assert wrong == []
    assert cuts["long_poll"] > 10  # disconnects really happened mid-poll
    tasks, fds, children, rss = after
    assert tasks <= before[0], (before, after)
    assert fds <= before[1] + 8, (before, after)  # a few pooled keep-alive sockets may differ
    assert children <= before[2], (before, after)
    assert rss <= rss_first_round * 1.10, (before, rss_first_round, after)
