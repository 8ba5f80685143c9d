"""Rollout-server figures through the full protocol (admission + long poll), client included.

Run with ``python benchmarks/server.py``. The server runs in its own process (uvicorn, as a
user's entry point would); the load generator is ``RolloutClient`` in this process; all on
127.0.0.1.
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp

from _proc import rss_mb
from _report import Figure, print_table
from _server_process import rollout_server, wait_ready
from osmosis_ai.rollout.client import RolloutClient

HERE = Path(__file__).resolve().parent
PROMPT = [{"role": "user", "content": "hi"}]
THROUGHPUT_ROLLOUTS = 20_000
CONCURRENCY = 256
IDLE_STEPS = (0, 2_000, 4_000, 6_000, 8_000, 10_000)


async def _throughput(url: str) -> tuple[float, list[float], int]:
    admissions: list[float] = []
    failures = 0
    remaining = THROUGHPUT_ROLLOUTS
    async with RolloutClient(url=url) as client:
        await wait_ready(client)

        async def worker(worker_id: int) -> None:
            nonlocal remaining, failures
            index = 0
            while remaining > 0:
                remaining -= 1
                index += 1
                started = time.perf_counter()
                handle = await client.run_rollout(
                    PROMPT, "http://127.0.0.1:9", f"w{worker_id}-{index}"
                )
                admissions.append(time.perf_counter() - started)
                if (await handle).status != "success":
                    failures += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(CONCURRENCY)))
        wall = time.perf_counter() - started
    return THROUGHPUT_ROLLOUTS / wall, admissions, failures


async def _idle_memory(url: str, pid: int, *, polled: bool) -> list[tuple[int, float]]:
    """Server RSS as idle rollouts accumulate, with or without a parked long poll each."""
    points: list[tuple[int, float]] = []
    handles = []
    admitted = 0
    async with RolloutClient(url=url) as client, aiohttp.ClientSession() as raw:
        await wait_ready(client)
        await asyncio.sleep(1)

        async def admit(index: int) -> None:
            rollout_id = f"idle-{index}"
            if polled:
                handles.append(await client.run_rollout(PROMPT, "http://127.0.0.1:9", rollout_id))
                return
            body = {
                "rollout_id": rollout_id,
                "initial_messages": PROMPT,
                "chat_completions_url": "http://127.0.0.1:9",
            }
            async with raw.post(f"{url}/rollout", json=body) as response:
                assert response.status == 202

        for target in IDLE_STEPS:
            while admitted < target:
                batch = min(500, target - admitted)
                await asyncio.gather(*(admit(admitted + i) for i in range(batch)))
                admitted += batch
            await asyncio.sleep(2)  # let every first long poll arrive and settle
            health = await client.health()
            assert health["lifecycle"]["active_rollouts"] == target
            points.append((target, rss_mb(pid)))
        for handle in handles:
            handle._task.cancel()
    return points


def _growth(points: list[tuple[int, float]]) -> float:
    return statistics.mean(
        (points[i + 1][1] - points[i][1]) / ((points[i + 1][0] - points[i][0]) / 1000)
        for i in range(len(points) - 1)
    )


def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    version = sys.version.split()[0]
    print(f"osmosis_ai rollout-server benchmarks — python {version}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-") as root:
        with rollout_server("noop", root) as (_, url):
            per_sec, admissions, failures = asyncio.run(_throughput(url))
        with rollout_server("idle", root) as (process, url):
            unpolled = asyncio.run(_idle_memory(url, process.pid, polled=False))
        with rollout_server("idle", root) as (process, url):
            polled = asyncio.run(_idle_memory(url, process.pid, polled=True))
    admissions.sort()
    ms = 1e3
    print_table(
        f"No-op workflow, {CONCURRENCY} concurrent clients, {THROUGHPUT_ROLLOUTS:,} rollouts",
        [
            Figure(
                "rollouts/s (admission + long poll + result)",
                per_sec,
                "/s",
                target=600,
                lower_is_better=False,
            ),
            Figure("admission latency p50", statistics.median(admissions) * ms, "ms"),
            Figure("admission latency p99", admissions[int(len(admissions) * 0.99)] * ms, "ms"),
            Figure("failed rollouts", failures, ""),
        ],
    )
    print_table(
        "Server RSS per 1,000 idle in-flight rollouts (measured up to 10,000)",
        [
            Figure("rollouts admitted, lease not yet polled", _growth(unpolled), "MB", target=7),
            Figure("each with a parked long poll (uvicorn)", _growth(polled), "MB"),
            Figure(f"RSS at {unpolled[-1][0]:,} unpolled", unpolled[-1][1], "MB"),
            Figure(f"RSS at {polled[-1][0]:,} polled", polled[-1][1], "MB"),
        ],
    )


if __name__ == "__main__":
    main()
