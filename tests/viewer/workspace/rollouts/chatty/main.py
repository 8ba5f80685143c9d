"""A test rollout for the viewer: a growing, previewable history, one model call per turn.

Per-row metadata: ``turns`` and ``pause`` (seconds between turns), ``fail`` (raise this
message at the end), ``artifact`` (write it to ``notes.txt`` in the artifacts directory),
``turn_reward`` (the grader gives the last turn this reward).
"""

from __future__ import annotations

import asyncio
import os

import httpx2

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.testing import HistorySource


class Chatty(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        meta = ctx.metadata or {}
        rollout = get_rollout_context()
        assert rollout is not None
        history = HistorySource(ctx.prompt)
        rollout.set_sample_source(history)
        if meta.get("artifact") and ctx.artifacts_dir is not None:
            path = ctx.artifacts_dir / "notes.txt"
            await asyncio.to_thread(path.write_text, str(meta["artifact"]))
        async with httpx2.AsyncClient(timeout=60) as http:
            for turn in range(int(meta.get("turns", 1))):
                if turn:
                    await asyncio.sleep(float(meta.get("pause", 0)))
                response = await http.post(
                    f"{rollout.chat_completions_url}/chat/completions",
                    json={"model": "policy", "messages": history.messages},
                    headers={"Authorization": f"Bearer {rollout.api_key}"},
                )
                response.raise_for_status()
                history.messages.append(response.json()["choices"][0]["message"])
        if meta.get("fail"):
            raise RuntimeError(str(meta["fail"]))


class Contains(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        answer = ctx.sample.messages[-1].get("content") or ""
        ctx.set_reward(1.0 if (ctx.label or "") in answer else 0.0)
        meta = ctx.metadata or {}
        if "turn_reward" in meta:
            ctx.set_turn_reward(int(meta.get("turns", 1)) - 1, float(meta["turn_reward"]))


app = create_rollout_server(
    backend=LocalBackend(workflow=Chatty, grader=Contains), preview_interval_sec=0.2
)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(
        app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]), log_level="warning"
    )
