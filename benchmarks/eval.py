"""Eval-runner figures: items/s for a no-op workflow, and the time outside the model.

Run with ``python benchmarks/eval.py``. Both runs use the real runner (``run_eval``): a
rollout server child process, the gateway, the protocol, the journal and the projections.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import osmosis_ai.eval.runner as runner
from _report import Figure, print_table
from osmosis_ai.eval.runner import EvalOptions, run_eval
from osmosis_ai.gateway import EmbeddedPolicy
from osmosis_ai.gateway.request import ChatRequest
from osmosis_ai.testing import ChatStub

ROOT = Path(__file__).resolve().parents[1]
NOOP_ITEMS = 5_000
EMBEDDED_ROWS = 8

NOOP_MAIN = """
import os
from osmosis_ai.rollout import AgentWorkflow, LocalBackend
from osmosis_ai.rollout.server import create_rollout_server

class NoOp(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, {"role": "assistant", "content": "ok"}]

app = create_rollout_server(backend=LocalBackend(workflow=NoOp), configure_logging=False)

if __name__ == "__main__":
    import uvicorn
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                loop="uvloop", http="httptools", log_level="warning")
"""


async def _noop(workspace: Path) -> tuple[float, int]:
    (workspace / "rollouts" / "noop").mkdir(parents=True)
    (workspace / "rollouts" / "noop" / "main.py").write_text(NOOP_MAIN)
    (workspace / "configs" / "eval").mkdir(parents=True)
    rows = "".join(
        json.dumps({"user_prompt": f"q{i}", "ground_truth": "ok"}) + "\n" for i in range(NOOP_ITEMS)
    )
    (workspace / "rows.jsonl").write_text(rows)
    async with ChatStub() as stub:
        config = workspace / "configs" / "eval" / "noop.toml"
        config.write_text(
            '[experiment]\nrollout = "noop"\nentrypoint = "main.py"\n'
            f'model_path = "openai:{stub.base_url}:stub"\ndataset = "rows.jsonl"\n'
        )
        started = time.perf_counter()
        outcome = await run_eval(EvalOptions(config_path=config, max_in_flight=64))
        wall = time.perf_counter() - started
    assert outcome.complete, outcome.halted
    return NOOP_ITEMS / wall, outcome.dispatched


class TimedEmbedded(EmbeddedPolicy):
    """The embedded policy, recording when it is busy generating."""

    intervals: list[tuple[float, float]] = []

    async def complete(self, request: ChatRequest) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            return await super().complete(request)
        finally:
            self.intervals.append((started, time.perf_counter()))


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


async def _embedded(workspace: Path) -> tuple[float, float, float]:
    shutil.copytree(ROOT / "examples" / "calculator", workspace, dirs_exist_ok=True)
    # The runner builds its policy from the config; time the embedded one it would build.
    runner.build_policy = lambda *args, **kwargs: TimedEmbedded()  # type: ignore[attr-defined]
    started = time.perf_counter()
    outcome = await run_eval(
        EvalOptions(
            config_path=workspace / "configs" / "eval" / "calculator.toml",
            rows=f"0-{EMBEDDED_ROWS - 1}",
        )
    )
    wall = time.perf_counter() - started
    assert outcome.complete, outcome.halted
    calls = TimedEmbedded.intervals[1:]  # the first call is the model preflight
    dispatch = max(stop for _, stop in calls) - min(start for start, _ in calls)
    return wall, dispatch, 1 - _union(calls) / dispatch


def main() -> None:
    version = sys.version.split()[0]
    print(f"osmosis_ai eval benchmarks — python {version}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-") as tmp:
        per_sec, dispatched = asyncio.run(_noop(Path(tmp) / "noop"))
        wall, dispatch, outside = asyncio.run(_embedded(Path(tmp) / "embedded"))
    print_table(
        f"No-op workflow, instant stub model, {NOOP_ITEMS:,} items, 64 in flight",
        [
            Figure(
                "items/s (whole run, start-up included)",
                per_sec,
                "/s",
                target=250,
                lower_is_better=False,
            ),
            Figure("items dispatched", dispatched, ""),
        ],
    )
    print_table(
        f"Calculator example on the embedded model, {EMBEDDED_ROWS} rows, default concurrency",
        [
            Figure("whole run (model load, server start-up)", wall, "s"),
            Figure("dispatch phase", dispatch, "s"),
            Figure("share of dispatch time with no generation", outside * 100, "%", target=5),
        ],
    )


if __name__ == "__main__":
    main()
