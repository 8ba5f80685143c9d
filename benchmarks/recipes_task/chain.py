"""A multi-turn task for ``benchmarks/recipes.py``: a chain of three dependent calculator
calls (start at A, apply an operation, then another to that result, then a third), in the
calculator example's workflow with room for four model calls.

The grader rewards each turn whose tool call computed the next value of the chain (turn
``i``, the ``i + 1``-th model call, gets 1; each value of the chain is credited once, in
order) with ``ctx.set_turn_reward``, and the outcome with the example's `CloseAnswer`
(partial credit for a near final number). ``credit = "outcome"`` trains on the outcome only,
``credit = "turn"`` on both. A row's ``metadata.chain`` holds the three values
(``chain_rows.py`` writes the rows).
"""

from __future__ import annotations

import json
import os

from main import CalculatorConfig, CalculatorWorkflow, CloseAnswer, calculate

from osmosis_ai.rollout import GraderContext, LocalBackend
from osmosis_ai.rollout.server import create_rollout_server


class ChainCredit(CloseAnswer):  # type: ignore[misc]  # the copied example's main.py
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        chain = list((ctx.metadata or {}).get("chain") or [])
        turns = [m for m in ctx.sample.messages if m.get("role") == "assistant"]
        reached = 0
        for turn, message in enumerate(turns):
            for call in message.get("tool_calls") or []:
                expression = json.loads(call["function"]["arguments"] or "{}").get("expression")
                if reached < len(chain) and calculate(str(expression)) == str(chain[reached]):
                    ctx.set_turn_reward(turn, 1.0)
                    reached += 1
                    break
        await super().grade(ctx)


backend = LocalBackend(
    workflow=CalculatorWorkflow, workflow_config=CalculatorConfig(max_turns=4), grader=ChainCredit
)
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]))
