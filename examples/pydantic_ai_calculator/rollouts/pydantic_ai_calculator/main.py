"""Pydantic AI calculator rollout: a Pydantic AI agent with one tool, run by `Agent.run`.

Osmosis has no Pydantic AI integration, and none is needed: the workflow gives the agent an
`OpenAIChatModel` whose `openai` client points at the rollout's OpenAI-compatible endpoint
(from `get_rollout_context()`), runs it, and returns the run's messages converted to OpenAI
chat messages, which become the sample. The grader compares the last number of the final
answer with the dataset's ground truth.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from typing import Any, Literal

import openai
from pydantic_ai import Agent, ModelSettings, UsageLimits, capture_run_messages
from pydantic_ai.exceptions import UnexpectedModelBehavior, UsageLimitExceeded
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.model_pool import tls_context
from osmosis_ai.rollout.server import create_rollout_server

_OPERATIONS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
}


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


class PydanticAICalculatorConfig(AgentWorkflowConfig):
    name: str = "pydantic-ai-calculator"
    temperature: float = 0.0
    max_tokens: int = 256
    max_model_calls: int = 4


def rollout_model() -> OpenAIChatModel:
    """An `OpenAIChatModel` on the active rollout's endpoint, its client closed with the rollout.

    ``max_retries=0``: the `openai` SDK retries a failed call twice by default, and under
    training a retried call is a second sample of the same prompt that the agent never sees,
    whose tokens would train as if it had. The client borrows the rollout server's pooled
    connection when there is one (`RolloutContext.model_pool`) and gives it back when the
    rollout's cleanups close it.
    """
    rollout = get_rollout_context()
    if rollout is None or not rollout.chat_completions_url:
        raise RuntimeError("build the model inside AgentWorkflow.run(), where a rollout is active")
    pool = rollout.model_pool
    client = openai.AsyncOpenAI(
        base_url=rollout.chat_completions_url,
        api_key=rollout.api_key or "osmosis-no-key",  # the client refuses to start without one
        http_client=(
            openai.DefaultAsyncHttpxClient(transport=pool.transport())
            if pool is not None
            else openai.DefaultAsyncHttpxClient(verify=tls_context())
        ),
        max_retries=0,
    )
    rollout.add_cleanup(client.close)
    # The rollout's endpoint decides what serves the model name.
    return OpenAIChatModel("osmosis-rollout", provider=OpenAIProvider(openai_client=client))


def to_openai_messages(
    model: OpenAIChatModel, messages: Sequence[ModelMessage]
) -> list[dict[str, Any]]:
    """A Pydantic AI run's messages as OpenAI chat messages, as the model was sent them.

    `Model.prepare_messages` first turns retry feedback into the parts it goes out as (a
    retried tool call's error as that call's tool result, other feedback as a user or system
    message); each part then becomes the chat message `OpenAIChatModel` sends for it.
    """
    out: list[dict[str, Any]] = []
    for message in model.prepare_messages(list(messages)):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, SystemPromptPart):
                    out.append({"role": "system", "content": part.content})
                elif isinstance(part, UserPromptPart):
                    content = part.content
                    if not isinstance(content, str):  # text items only; the rows have no files
                        content = "\n".join(item for item in content if isinstance(item, str))
                    out.append({"role": "user", "content": content})
                elif isinstance(part, ToolReturnPart):
                    out.append(
                        {
                            "role": "tool",
                            "tool_call_id": part.tool_call_id,
                            "content": part.model_response_str(),
                        }
                    )
        elif isinstance(message, ModelResponse):
            texts = [part.content for part in message.parts if isinstance(part, TextPart)]
            calls = [
                {
                    "id": part.tool_call_id,
                    "type": "function",
                    "function": {"name": part.tool_name, "arguments": part.args_as_json_str()},
                }
                for part in message.parts
                if isinstance(part, ToolCallPart)
            ]
            reply: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts) or None}
            if calls:
                reply["tool_calls"] = calls
            out.append(reply)
    return out


class PydanticAICalculatorWorkflow(AgentWorkflow[PydanticAICalculatorConfig]):
    async def run(
        self, ctx: AgentWorkflowContext[PydanticAICalculatorConfig]
    ) -> list[dict[str, Any]]:
        config = ctx.config or PydanticAICalculatorConfig()
        model = rollout_model()
        # The row's system message becomes the agent's system prompt (kept in the run's
        # messages, unlike `instructions`), its user message the run's prompt.
        agent = Agent(
            model,
            system_prompt=[m["content"] for m in ctx.prompt if m["role"] == "system"],
            model_settings=ModelSettings(
                temperature=config.temperature, max_tokens=config.max_tokens
            ),
            tools=[calculate],
        )
        user_prompt = "\n\n".join(m["content"] for m in ctx.prompt if m["role"] == "user")
        # Out of model calls, or a reply the agent could not use (a tool call cut off at
        # max_tokens, retries used up): the conversation so far is the sample and is graded
        # like any other.
        with (
            capture_run_messages() as messages,
            contextlib.suppress(UsageLimitExceeded, UnexpectedModelBehavior),
        ):
            await agent.run(
                user_prompt, usage_limits=UsageLimits(request_limit=config.max_model_calls)
            )
        return to_openai_messages(model, messages)


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _final_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return str(message.get("content") or "")
    return ""


class LastNumberGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        numbers = _NUMBER.findall(_final_text(ctx.sample.messages))
        ctx.set_reward(1.0 if numbers and float(numbers[-1]) == float(ctx.label or "nan") else 0.0)


pydantic_ai_calculator_config = PydanticAICalculatorConfig()
backend = LocalBackend(
    workflow=PydanticAICalculatorWorkflow,
    workflow_config=pydantic_ai_calculator_config,
    grader=LastNumberGrader,
)
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))
