"""OpenAI Agents SDK calculator rollout: an agent with one function tool, run by `Runner.run`.

`OsmosisAgent` binds the `OsmosisRolloutModel` placeholder to the rollout's endpoint, in the
SDK's default Responses API, and `OsmosisMemorySession` records the conversation as the
sample, so `run()` returns nothing. The grader reads the session's items (Responses-API
shape) and compares the last number of the final answer with the dataset's ground truth.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Literal

from agents import ModelSettings, Runner, function_tool
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    LocalBackend,
)
from osmosis_ai.rollout.integrations.agents.openai_agents import (
    OsmosisAgent,
    OsmosisMemorySession,
    OsmosisRolloutModel,
)
from osmosis_ai.rollout.server import create_rollout_server

_OPERATIONS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
}


@function_tool
def calculate(a: float, operator: Literal["+", "-", "*", "/"], b: float) -> str:
    """Apply an arithmetic operator to two numbers.

    Args:
        a: The left operand.
        operator: One of + - * /.
        b: The right operand.
    """
    try:
        value = float(_OPERATIONS[operator](a, b))
    except ZeroDivisionError:
        return "error: division by zero"
    return str(int(value)) if value.is_integer() else f"{value:.6g}"


class OpenAIAgentsCalculatorConfig(AgentWorkflowConfig):
    name: str = "openai-agents-calculator"
    temperature: float = 0.0
    max_tokens: int = 256
    max_turns: int = 4


class OpenAIAgentsCalculatorWorkflow(AgentWorkflow[OpenAIAgentsCalculatorConfig]):
    async def run(self, ctx: AgentWorkflowContext[OpenAIAgentsCalculatorConfig]) -> None:
        config = ctx.config or OpenAIAgentsCalculatorConfig()
        agent = OsmosisAgent(
            name="calculator",
            model=OsmosisRolloutModel(),
            model_settings=ModelSettings(
                temperature=config.temperature, max_tokens=config.max_tokens
            ),
            tools=[calculate],
        )
        session = OsmosisMemorySession()
        # Out of turns, or a reply cut at max_tokens (the Responses API's `incomplete`, which
        # the SDK raises on): the conversation so far is in the session and is graded like
        # any other.
        with contextlib.suppress(MaxTurnsExceeded, ModelBehaviorError):
            await Runner.run(agent, ctx.prompt, session=session, max_turns=config.max_turns)


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _final_text(items: list[dict[str, Any]]) -> str:
    for item in reversed(items):
        if item.get("type") == "message" and item.get("role") == "assistant":
            return " ".join(part.get("text", "") for part in item.get("content", []))
    return ""


class LastNumberGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        numbers = _NUMBER.findall(_final_text(ctx.sample.messages))
        ctx.set_reward(1.0 if numbers and float(numbers[-1]) == float(ctx.label or "nan") else 0.0)


openai_agents_calculator_config = OpenAIAgentsCalculatorConfig()
backend = LocalBackend(
    workflow=OpenAIAgentsCalculatorWorkflow,
    workflow_config=openai_agents_calculator_config,
    grader=LastNumberGrader,
)
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))
