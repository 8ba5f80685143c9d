"""The calculator rollout with slow tools, for ``benchmarks/async_training.py``: the start of
each rollout (an environment's set-up) and each tool call sleep for a seeded lognormal time,
as sandboxed code runs, test suites and web tools take. Held-out rollouts (ids ``eval-...``)
do not sleep: the benchmark measures training, and their cost is the same at every setting.

The grader gives partial credit (the example's `CloseAnswer`), so that the rewards of a group
almost always differ and every step of every setting updates: the settings compare equal
work. With the exact-answer grader and the base model's few successes, most groups have
all-equal rewards, which steps update at all is luck, and a step without an update costs no
update time.

Settings come from the environment (the training config's ``[env]``): ``BENCH_TOOL_MEDIAN_SEC``
(the median), ``BENCH_TOOL_SIGMA`` (σ of the log) and ``BENCH_SEED``.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
from collections import Counter
from typing import Any

from main import CalculatorConfig, CalculatorWorkflow, CloseAnswer

from osmosis_ai.rollout import AgentWorkflowContext, LocalBackend, get_rollout_context
from osmosis_ai.rollout.server import create_rollout_server

_MEDIAN_SEC = float(os.environ.get("BENCH_TOOL_MEDIAN_SEC", "1.5"))
_SIGMA = float(os.environ.get("BENCH_TOOL_SIGMA", "1.0"))
_SEED = os.environ.get("BENCH_SEED", "0")
#: Tool calls made so far per rollout: the n-th call's wait is the same in every run.
_CALLS: Counter[str] = Counter()


async def _wait(what: str) -> None:
    """Sleep a lognormal time drawn from the seed, the rollout and ``what``."""
    rollout = get_rollout_context()
    assert rollout is not None
    if rollout.rollout_id.startswith("eval-"):
        return
    if what == "tool":
        _CALLS[rollout.rollout_id] += 1
        what = f"tool-{_CALLS[rollout.rollout_id]}"
    draw = random.Random(f"{_SEED}:{rollout.rollout_id}:{what}")
    await asyncio.sleep(draw.lognormvariate(math.log(_MEDIAN_SEC), _SIGMA))


class SlowToolsWorkflow(CalculatorWorkflow):
    async def run(self, ctx: AgentWorkflowContext[CalculatorConfig]) -> list[dict[str, Any]]:
        await _wait("setup")
        return await super().run(ctx)

    async def call_tool(self, call: dict[str, Any]) -> str:
        await _wait("tool")
        return await super().call_tool(call)


backend = LocalBackend(
    workflow=SlowToolsWorkflow, workflow_config=CalculatorConfig(), grader=CloseAnswer
)
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]))
