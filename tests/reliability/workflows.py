"""The chaos workflow: its fault is chosen by the row (``metadata["fault"]``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx2

from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowContext, get_rollout_context


class Chaos(AgentWorkflow):
    """One model call, then the injected fault (or none)."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        fault = (ctx.metadata or {}).get("fault", "none")
        if fault == "raise":
            raise RuntimeError("injected tool failure")
        if fault == "hang":
            await asyncio.sleep(60)  # past any deadline the row has
        if fault == "block":
            time.sleep(float((ctx.metadata or {}).get("block_sec", 0.3)))  # noqa: ASYNC251
        rollout = get_rollout_context()
        assert rollout is not None
        async with httpx2.AsyncClient(timeout=30) as http:
            reply = await http.post(
                f"{rollout.chat_completions_url}/chat/completions",
                headers={"Authorization": f"Bearer {rollout.api_key}"},
                json={"model": "policy", "messages": ctx.prompt},
            )
        reply.raise_for_status()  # upstream faults surface here
        return [*ctx.prompt, reply.json()["choices"][0]["message"]]
