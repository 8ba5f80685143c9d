"""Agents written against the official clients' own APIs, not chat completions: an ``openai``
client calling the Responses API and an ``anthropic`` client calling the Messages API (its
replies streamed), each with a calculator tool, at the rollout's endpoint. The row's metadata
picks the API, so one training run trains both. The sample is the conversation as chat
messages, for the grader."""

from __future__ import annotations

import json
import operator
import os
import re
from collections.abc import Callable
from typing import Any

import anthropic
import openai

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    LocalBackend,
    RolloutContext,
    get_rollout_context,
)
from osmosis_ai.rollout.server import create_rollout_server

PARAMETERS = {
    "type": "object",
    "properties": {"expression": {"type": "string", "description": "e.g. 143 + 55"}},
    "required": ["expression"],
}
DESCRIPTION = "Apply + - * or / to two numbers, given as an expression like 143 + 55."
MAX_TURNS = 3
MAX_TOKENS = 96

_OPERATIONS: dict[str, Callable[[float, float], float]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
}  # fmt: skip
_BINARY = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*([-+*/])\s*(-?\d+(?:\.\d+)?)\s*")


def calculate(expression: str) -> str:
    """One binary operation on two numbers (the questions' own form)."""
    match = _BINARY.fullmatch(expression)
    if match is None:
        return "error: send two numbers and one of + - * /, as in 143 + 55"
    left, sign, right = match.groups()
    try:
        value = _OPERATIONS[sign](float(left), float(right))
    except ZeroDivisionError:
        return "error: division by zero"
    return str(int(value)) if value.is_integer() else f"{value:.6g}"


def _argument(arguments: object) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            return ""
    return str(arguments.get("expression", "")) if isinstance(arguments, dict) else ""


async def responses_agent(rollout: RolloutContext, system: str, question: str) -> list[Any]:
    """The Responses API's own loop: output items go back as input items."""
    tool: Any = {"type": "function", "name": "calculator", "description": DESCRIPTION,
            "parameters": PARAMETERS}  # fmt: skip
    chat: list[dict[str, Any]] = [{"role": "user", "content": question}]
    items: list[Any] = [{"role": "user", "content": question}]
    async with openai.AsyncOpenAI(
        base_url=rollout.chat_completions_url, api_key=rollout.api_key or "none", max_retries=0
    ) as client:
        for _ in range(MAX_TURNS):
            response = await client.responses.create(
                model="policy", instructions=system, input=items, tools=[tool],
                max_output_tokens=MAX_TOKENS,
            )  # fmt: skip
            items += [item.model_dump(exclude_none=True) for item in response.output]
            calls = [item for item in response.output if item.type == "function_call"]
            chat.append({"role": "assistant", "content": response.output_text,
                         "tool_calls": [{"id": c.call_id, "type": "function", "function":
                                         {"name": c.name, "arguments": c.arguments}}
                                        for c in calls]})  # fmt: skip
            if not calls:
                break
            for call in calls:
                result = calculate(_argument(call.arguments))
                items.append({"type": "function_call_output", "call_id": call.call_id,
                              "output": result})  # fmt: skip
                chat.append({"role": "tool", "tool_call_id": call.call_id, "content": result})
    return chat


async def messages_agent(rollout: RolloutContext, system: str, question: str) -> list[Any]:
    """The Messages API's own loop, streamed: tool results go back in a user turn."""
    tool: Any = {"name": "calculator", "description": DESCRIPTION, "input_schema": PARAMETERS}
    chat: list[dict[str, Any]] = [{"role": "user", "content": question}]
    turns: list[Any] = [{"role": "user", "content": question}]
    async with anthropic.AsyncAnthropic(
        base_url=rollout.chat_completions_url, api_key=rollout.api_key or "none", max_retries=0
    ) as client:
        for _ in range(MAX_TURNS):
            async with client.messages.stream(
                model="policy", system=system, messages=turns, tools=[tool],
                max_tokens=MAX_TOKENS,
            ) as stream:  # fmt: skip
                message = await stream.get_final_message()
            turns.append({"role": "assistant",
                          "content": [block.model_dump(exclude_none=True)
                                      for block in message.content]})  # fmt: skip
            uses = [block for block in message.content if block.type == "tool_use"]
            text = "".join(block.text for block in message.content if block.type == "text")
            chat.append({"role": "assistant", "content": text,
                         "tool_calls": [{"id": u.id, "type": "function", "function":
                                         {"name": u.name, "arguments": json.dumps(u.input)}}
                                        for u in uses]})  # fmt: skip
            if not uses:
                break
            results = [(use.id, calculate(_argument(use.input))) for use in uses]
            turns.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use_id, "content": result}
                for use_id, result in results]})  # fmt: skip
            chat += [{"role": "tool", "tool_call_id": i, "content": r} for i, r in results]
    return chat


class ApiAgentsWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[Any]:
        rollout = get_rollout_context()
        assert rollout is not None, "run() is called inside a rollout context"
        system = next(m["content"] for m in ctx.prompt if m["role"] == "system")
        question = next(m["content"] for m in ctx.prompt if m["role"] == "user")
        agent = (
            responses_agent if (ctx.metadata or {}).get("api") == "responses" else messages_agent
        )
        return [{"role": "system", "content": system}, *await agent(rollout, system, question)]


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class LastNumberGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        final = next(
            (m.get("content") or "" for m in reversed(ctx.sample.messages)
             if m.get("role") == "assistant"), ""
        )  # fmt: skip
        numbers = _NUMBER.findall(final)
        ctx.set_reward(1.0 if numbers and float(numbers[-1]) == float(ctx.label or "nan") else 0.0)


backend = LocalBackend(workflow=ApiAgentsWorkflow, grader=LastNumberGrader)
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))
