"""RayBackend figures: CPU-bound throughput with 1 and 2 executor actors, and dispatch overhead.

Run with ``python benchmarks/ray_backend.py``. A local Ray instance (2 CPUs, loopback only)
runs the actors; rollouts are driven through ``RayBackend.execute`` in this process, as the
rollout server would. Throughput uses a workflow that spins the CPU for about 40 ms; the
overhead compares the sequential median latency of a no-op rollout on Ray with the same
rollout on `LocalBackend`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Before Ray is imported: bind 127.0.0.1, no token files.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray

from _report import Figure, print_table
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    ExecutionRequest,
    LocalBackend,
    RolloutContext,
)
from osmosis_ai.rollout.backend.ray import RayBackend

SPIN_ROLLOUTS = 40
SPIN_ITERATIONS = 600_000
OVERHEAD_ROLLOUTS = 300


class Spin(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        total = 0
        for value in range(int((ctx.metadata or {})["iterations"])):
            total = (total + value * value) % 1_000_003
        return [{"role": "assistant", "content": str(total)}]


class NoOp(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": "done"}]


def _request(index: int, **metadata: Any) -> ExecutionRequest:
    return ExecutionRequest(
        id=f"b{index}", prompt=[{"role": "user", "content": "x"}], metadata=metadata or None
    )


async def _throughput(num_actors: int) -> float:
    backend = RayBackend(workflow=Spin, num_actors=num_actors, actor_concurrency=4)
    await backend.start()
    try:
        started = time.perf_counter()
        with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1"):
            outcomes = await asyncio.gather(
                *(
                    backend.execute(_request(i, iterations=SPIN_ITERATIONS))
                    for i in range(SPIN_ROLLOUTS)
                )
            )
        elapsed = time.perf_counter() - started
    finally:
        await backend.shutdown()
    assert all(o.result.ok for o in outcomes), [o.result.err_message for o in outcomes]
    return SPIN_ROLLOUTS / elapsed


async def _median_latency_ms(backend: Any) -> float:
    latencies = []
    with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1"):
        for index in range(OVERHEAD_ROLLOUTS):
            started = time.perf_counter()
            outcome = await backend.execute(_request(index))
            latencies.append((time.perf_counter() - started) * 1000)
            assert outcome.result.ok
    return statistics.median(latencies[20:])  # after warm-up


async def main() -> None:
    one = await _throughput(1)
    two = await _throughput(2)
    ray_backend = RayBackend(workflow=NoOp, num_actors=1)
    await ray_backend.start()
    try:
        on_ray = await _median_latency_ms(ray_backend)
    finally:
        await ray_backend.shutdown()
    local = await _median_latency_ms(LocalBackend(workflow=NoOp))
    print_table(
        f"CPU-bound workflow (~{SPIN_ITERATIONS:,} iterations), {SPIN_ROLLOUTS} rollouts",
        [
            Figure("throughput, 1 actor", one, "rollouts/s"),
            Figure("throughput, 2 actors", two, "rollouts/s"),
            Figure("scaling, 2 actors / 1", two / one, "x", 1.7, lower_is_better=False),
        ],
    )
    print_table(
        f"No-op rollout, sequential median of {OVERHEAD_ROLLOUTS}",
        [
            Figure("LocalBackend", local, "ms"),
            Figure("RayBackend", on_ray, "ms"),
            Figure("Ray dispatch overhead", on_ray - local, "ms", 5),
        ],
    )


if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    try:
        asyncio.run(main())
    finally:
        ray.shutdown()
