"""ProcessBackend figures: per-rollout overhead versus LocalBackend, and deadline enforcement.

Run with ``python benchmarks/process_backend.py``. Rollouts are driven through
``execute()`` in this process, as the rollout server would, one at a time. Overhead is the
sequential median latency of a no-op rollout (workflow phase only, no grader) minus the
same rollout on `LocalBackend`: with the warm pool (a ``fork()`` per rollout), cold (a fresh
interpreter per rollout) and cold inside bubblewrap. Deadline enforcement runs a workflow
that spins the CPU forever under a 1 s deadline and reports how long after the deadline
each rollout ended (its process group killed).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import Figure, print_table
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    ExecutionBackend,
    ExecutionRequest,
    LocalBackend,
    RolloutContext,
)
from osmosis_ai.rollout.backend.process import ProcessBackend

WARM_ROLLOUTS = 300
COLD_ROLLOUTS = 40
DEADLINE_ROLLOUTS = 8
DEADLINE_SEC = 1.0


class NoOp(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": "done"}]


class Spin(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        while True:
            pass


def _request(index: int, timeout: float | None = None) -> ExecutionRequest:
    return ExecutionRequest(
        id=f"b{index}", prompt=[{"role": "user", "content": "x"}], agent_timeout_sec=timeout
    )


async def _median_latency_ms(backend: ExecutionBackend, rollouts: int) -> float:
    latencies = []
    await backend.start()
    try:
        with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1"):
            for index in range(rollouts):
                started = time.perf_counter()
                outcome = await backend.execute(_request(index))
                latencies.append((time.perf_counter() - started) * 1000)
                assert outcome.result.ok, outcome.result.err_message
    finally:
        await backend.shutdown()
    return statistics.median(latencies[rollouts // 10 :])  # after warm-up


async def _deadline_errors(backend: ProcessBackend) -> list[float]:
    errors = []
    try:
        with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1"):
            for index in range(DEADLINE_ROLLOUTS):
                started = time.perf_counter()
                outcome = await backend.execute(_request(index, DEADLINE_SEC))
                errors.append(time.perf_counter() - started - DEADLINE_SEC)
                assert outcome.result.err_category == "timeout", outcome.result.err_message
    finally:
        await backend.shutdown()
    return errors


async def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="osmosis-bench-process-"))
    try:
        local = await _median_latency_ms(LocalBackend(workflow=NoOp, artifact_root=root), 300)
        warm = await _median_latency_ms(
            ProcessBackend(workflow=NoOp, artifact_root=root), WARM_ROLLOUTS
        )
        cold = await _median_latency_ms(
            ProcessBackend(workflow=NoOp, artifact_root=root, warm_pool=False), COLD_ROLLOUTS
        )
        sandboxed = await _median_latency_ms(
            ProcessBackend(workflow=NoOp, artifact_root=root, sandbox=True), COLD_ROLLOUTS
        )
        errors = await _deadline_errors(ProcessBackend(workflow=Spin, artifact_root=root))
        sandbox_errors = await _deadline_errors(
            ProcessBackend(workflow=Spin, artifact_root=root, sandbox=True)
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(
        "No-op rollout, sequential median latency",
        [
            Figure("LocalBackend", local, "ms"),
            Figure("ProcessBackend, warm pool", warm, "ms"),
            Figure("ProcessBackend, cold", cold, "ms"),
            Figure("ProcessBackend, bubblewrap", sandboxed, "ms"),
            Figure("overhead, warm pool", warm - local, "ms", 10),
            Figure("overhead, cold", cold - local, "ms"),
            Figure("overhead, bubblewrap (cold)", sandboxed - local, "ms"),
        ],
    )
    print_table(
        f"Deadline enforcement: CPU-spinning workflow, {DEADLINE_SEC:g} s deadline, "
        f"{DEADLINE_ROLLOUTS} rollouts each",
        [
            Figure("end after deadline, worst (pool)", max(errors), "s", 1.0),
            Figure("end after deadline, median (pool)", statistics.median(errors), "s"),
            Figure("end after deadline, worst (bubblewrap)", max(sandbox_errors), "s", 1.0),
        ],
    )


if __name__ == "__main__":
    asyncio.run(main())
