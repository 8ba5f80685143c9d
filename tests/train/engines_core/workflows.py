"""Workflows the engine-core tests run (module level: Ray ships them to its actors)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    get_rollout_context,
)


class Chat(AgentWorkflow):
    """``metadata["kind"]``: ``chat`` (``turns`` calls, default 2), ``raise``, ``leak``
    (raises with the rollout's key in the message), ``sleep`` (60 s, for deadlines) or
    ``remove`` (chats; the grader removes the sample)."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        meta = ctx.metadata or {}
        kind = meta.get("kind", "chat")
        if kind == "raise":
            raise ValueError("the tool input was bad")
        if kind == "sleep":
            await asyncio.sleep(60)
        rollout = get_rollout_context()
        assert rollout is not None
        if kind == "leak":
            raise RuntimeError(f"upstream refused key {rollout.api_key}")
        messages = list(ctx.prompt)
        async with httpx2.AsyncClient(timeout=120) as http:
            for turn in range(int(meta.get("turns", 2))):
                reply = await http.post(
                    f"{rollout.chat_completions_url}/chat/completions",
                    headers={"Authorization": f"Bearer {rollout.api_key}"},
                    json={"model": "m", "messages": messages, "max_tokens": 8},
                )
                reply.raise_for_status()
                messages.append(reply.json()["choices"][0]["message"])
                messages.append({"role": "user", "content": f"go on {turn}"})
        return messages[:-1]


class Judge(Grader):
    """``metadata["reward"]`` when given, else 1.0 when the first answer echoes the label
    (0.0 otherwise); removes ``kind == remove``."""

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        meta = ctx.metadata or {}
        if meta.get("kind") == "remove":
            ctx.sample.remove_sample = True
            return
        if "reward" in meta:
            ctx.set_reward(float(meta["reward"]))
            return
        answers = [m for m in ctx.sample.messages if m.get("role") == "assistant"]
        ctx.set_reward(1.0 if answers and (ctx.label or "") in answers[0]["content"] else 0.0)
