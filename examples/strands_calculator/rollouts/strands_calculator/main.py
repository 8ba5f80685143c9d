"""Strands calculator rollout: a Strands agent with one tool, bound to the rollout's model.

`OsmosisStrandsAgent` swaps the `OsmosisRolloutModel` placeholder for a model on the rollout's
OpenAI-compatible endpoint and records the agent's history as the sample, so `run()` returns
nothing. The grader reads the Strands history and compares the last number of the final
answer with the dataset's ground truth.
"""

from __future__ import annotations

import os
import re
from typing import Literal

from strands import tool
from strands.types.exceptions import MaxTokensReachedException

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    LocalBackend,
)
from osmosis_ai.rollout.integrations.agents.strands import (
    OsmosisRolloutModel,
    OsmosisStrandsAgent,
)
from osmosis_ai.rollout.server import create_rollout_server


@tool
def calculate(a: float, operator: Literal["+", "-", "*", "/"], b: float) -> str:
    """Apply an arithmetic operator to two numbers.

    Args:
        a: The left operand.
        operator: One of + - * /.
        b: The right operand.
    """
    if operator == "/" and b == 0:
        return "error: division by zero"
    match operator:
        case "+":
            value = a + b
        case "-":
            value = a - b
        case "*":
            value = a * b
        case _:
            value = a / b
    return str(int(value)) if value.is_integer() else f"{value:.6g}"


class StrandsCalculatorConfig(AgentWorkflowConfig):
    name: str = "strands-calculator"
    temperature: float = 0.0
    max_tokens: int = 256
    max_iterations: int = 3


class StrandsCalculatorWorkflow(AgentWorkflow[StrandsCalculatorConfig]):
    async def run(self, ctx: AgentWorkflowContext[StrandsCalculatorConfig]) -> None:
        config = ctx.config or StrandsCalculatorConfig()
        agent = OsmosisStrandsAgent(
            name="calculator",
            model=OsmosisRolloutModel(
                params={"temperature": config.temperature, "max_tokens": config.max_tokens}
            ),
            tools=[calculate],
            messages=ctx.prompt,
            callback_handler=None,
        )
        # Strands runs tool cycles inside one invocation; the loop only resumes an agent that
        # stopped on a tool call (as the user guide's tool workflow does).
        for _ in range(config.max_iterations):
            try:
                result = await agent.invoke_async()
            except MaxTokensReachedException:
                break  # the cut-off answer stays in the history and is graded like any other
            if not any("toolUse" in block for block in result.message.get("content", [])):
                break


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class LastNumberGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        final = next(
            (
                " ".join(block.get("text", "") for block in message["content"])
                for message in reversed(ctx.sample.messages)
                if message["role"] == "assistant"
            ),
            "",
        )
        numbers = _NUMBER.findall(final)
        ctx.set_reward(1.0 if numbers and float(numbers[-1]) == float(ctx.label or "nan") else 0.0)


strands_calculator_config = StrandsCalculatorConfig()
backend = LocalBackend(
    workflow=StrandsCalculatorWorkflow,
    workflow_config=strands_calculator_config,
    grader=LastNumberGrader,
)
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))
