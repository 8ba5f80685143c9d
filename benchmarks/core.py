"""Rollout-core figures: LocalBackend overhead, import time, trajectory saving.

Run with ``make bench`` or ``python benchmarks/core.py``. Prints a table; exits 0 whatever
the figures are (benchmarks report, tests assert).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import Figure, print_table
from _trajectory import measure_save_trajectory
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    ExecutionRequest,
    LocalBackend,
)

SEQUENTIAL_ROLLOUTS = 3000
CONCURRENT_ROLLOUTS = 6400
CONCURRENCY = 64
IMPORT_RUNS = 15


class NoOp(AgentWorkflow):
    """Returns one message without calling anything."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": "done"}]


def _request(rollout_id: str) -> ExecutionRequest:
    return ExecutionRequest(id=rollout_id, prompt=[{"role": "user", "content": "hi"}])


async def _execute_overhead(root: Path) -> dict[str, float]:
    backend = LocalBackend(workflow=NoOp, artifact_root=root)
    durations = []
    for index in range(SEQUENTIAL_ROLLOUTS):
        started = time.perf_counter()
        await backend.execute(_request(f"seq-{index}"))
        durations.append(time.perf_counter() - started)
    steady = sorted(durations[SEQUENTIAL_ROLLOUTS // 10 :])  # drop warm-up

    slots = asyncio.Semaphore(CONCURRENCY)

    async def one(index: int) -> None:
        async with slots:
            await backend.execute(_request(f"conc-{index}"))

    wall, cpu = time.perf_counter(), time.thread_time()
    await asyncio.gather(*(one(index) for index in range(CONCURRENT_ROLLOUTS)))
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    return {
        "median": statistics.median(steady),
        "p90": steady[int(len(steady) * 0.9)],
        "amortized": wall / CONCURRENT_ROLLOUTS,
        "loop_cpu": cpu / CONCURRENT_ROLLOUTS,
    }


def _import_time() -> float:
    code = (
        "import time; t = time.perf_counter(); import osmosis_ai.rollout; "
        "print(time.perf_counter() - t)"
    )
    samples = [
        float(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(IMPORT_RUNS)
    ]
    return statistics.median(samples)


def main() -> None:
    print(f"osmosis_ai core benchmarks — python {sys.version.split()[0]}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-") as tmp:
        overhead = asyncio.run(_execute_overhead(Path(tmp)))
    save = measure_save_trajectory(n_steps=50, repeats=200)
    us = 1e6
    print_table(
        "LocalBackend.execute, no-op workflow (includes the artifacts directory, made off-loop)",
        [
            Figure("sequential median", overhead["median"] * us, "µs", target=150),
            Figure("sequential p90", overhead["p90"] * us, "µs"),
            Figure(f"amortized at {CONCURRENCY} concurrent", overhead["amortized"] * us, "µs"),
            Figure("event-loop CPU per rollout", overhead["loop_cpu"] * us, "µs"),
        ],
    )
    print_table(
        "Import and persistence",
        [
            Figure(
                "import osmosis_ai.rollout (fresh process)", _import_time() * 1e3, "ms", target=250
            ),
            Figure("save_trajectory, 50 steps, median", save["median_s"] * 1e3, "ms", target=3),
            Figure("save_trajectory, 50 steps, p90", save["p90_s"] * 1e3, "ms"),
        ],
    )


if __name__ == "__main__":
    main()
