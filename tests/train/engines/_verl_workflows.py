"""Workflows and graders the verl adapter tests run (named by "module:Class" in YAML)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    get_rollout_context,
)

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


async def ask(messages: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
    """One chat completion through the rollout's gateway URL; returns the message."""
    rollout = get_rollout_context()
    assert rollout is not None
    async with httpx2.AsyncClient(timeout=120) as http:
        response = await http.post(
            f"{rollout.chat_completions_url}/chat/completions",
            json={"messages": messages, "max_tokens": 12, **body},
            headers={"Authorization": f"Bearer {rollout.api_key}"},
        )
    response.raise_for_status()
    message: dict[str, Any] = response.json()["choices"][0]["message"]
    return message


class FollowUp(AgentWorkflow):
    """Two chaining turns: an answer, a user follow-up, another answer."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        messages = list(ctx.prompt)
        messages.append(await ask(messages))
        messages.append({"role": "user", "content": "Say it again, shorter."})
        messages.append(await ask(messages))
        return messages


class Rewrite(AgentWorkflow):
    """Rewrites history between calls (a summarising agent): the prompts do not chain."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        first = await ask(list(ctx.prompt))
        summary = [
            {"role": "system", "content": "Earlier you said: " + str(first.get("content"))},
            {"role": "user", "content": "Now name a fruit."},
        ]
        return [*summary, await ask(summary)]


class Calculator(AgentWorkflow):
    """A tool call, its result, an answer."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        messages = list(ctx.prompt)
        call = await ask(messages, tools=[CALCULATOR], max_tokens=96)
        messages.append(call)
        for tool_call in call.get("tool_calls") or []:
            expression = json.loads(tool_call["function"]["arguments"])["expression"]
            total = sum(int(part) for part in expression.split("+"))
            messages.append(
                {"role": "tool", "tool_call_id": tool_call["id"], "content": str(total)}
            )
        messages.append(await ask(messages, tools=[CALCULATOR]))
        return messages


class FailsAfterOneCall(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        await ask(list(ctx.prompt))
        raise RuntimeError("the tool crashed")


class Sleeps(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        await asyncio.sleep(60)
        return list(ctx.prompt)


class MetadataReward(Grader):
    """Rewards ``metadata["reward"]`` when the label is the row's ground truth, else -1."""

    async def grade(self, ctx: GraderContext) -> None:
        meta = ctx.metadata or {}
        ctx.set_reward(float(meta["reward"]) if ctx.label == meta.get("truth") else -1.0)


class Removes(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        ctx.sample.remove_sample = True
