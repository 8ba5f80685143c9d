"""Workflows the Ray backend tests run on executor actors (shipped to them by value)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowContext, Grader, GraderContext


class Remote(AgentWorkflow):
    """Answers "42". Metadata: ``sleep`` seconds first; ``artifact`` text to write to
    ``out.txt``; ``started`` a file written when the workflow starts; ``marker`` a file
    written when the rollout is cancelled on the actor."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        meta = ctx.metadata or {}
        if meta.get("started"):
            await asyncio.to_thread(Path(meta["started"]).write_text, "started")
        if meta.get("artifact") and ctx.artifacts_dir is not None:
            path = ctx.artifacts_dir / "out.txt"
            await asyncio.to_thread(path.write_text, str(meta["artifact"]))
        try:
            await asyncio.sleep(float(meta.get("sleep", 0)))
        except asyncio.CancelledError:
            if meta.get("marker"):
                await asyncio.to_thread(Path(meta["marker"]).write_text, "cancelled on the actor")
            raise
        return [*ctx.prompt, {"role": "assistant", "content": "42"}]


class ExactMatch(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)
