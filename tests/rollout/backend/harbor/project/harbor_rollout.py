"""The user project the Harbor tests bundle: a workflow calling the gateway, and a grader.

Imported as a top-level module (its directory is the project root the bundle takes).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx2

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    get_rollout_context,
)


class AskConfig(AgentWorkflowConfig):
    max_tokens: int = 16


class AskTheModel(AgentWorkflow[AskConfig]):
    """One chat call through the rollout endpoint; echoes the key when asked to (a canary)."""

    async def run(self, ctx: AgentWorkflowContext[AskConfig]) -> list[dict[str, Any]]:
        context = get_rollout_context()
        assert context is not None
        meta = ctx.metadata or {}
        if meta.get("started"):  # a file that tells a test the workflow is running
            await asyncio.to_thread(Path(meta["started"]).write_text, "")
        if meta.get("sleep"):
            await asyncio.sleep(float(meta["sleep"]))
        assert self.config is not None
        async with httpx2.AsyncClient(timeout=60) as client:
            reply = await client.post(
                f"{context.chat_completions_url}/chat/completions",
                headers={"Authorization": f"Bearer {context.api_key}"},
                json={
                    "model": "policy",
                    "messages": ctx.prompt,
                    "max_tokens": self.config.max_tokens,
                },
            )
        reply.raise_for_status()
        answer = reply.json()["choices"][0]["message"]["content"] or ""
        if meta.get("leak_key"):
            # A careless agent: the key lands in its output, its log and an artifact.
            print(f"debug: key={context.api_key}")
            answer = f"{answer} {context.api_key}"
        if ctx.artifacts_dir is not None:
            await asyncio.to_thread(Path(ctx.artifacts_dir, "answer.txt").write_text, answer)
            await asyncio.to_thread(Path(ctx.artifacts_dir, "where.txt").write_text, os.getcwd())
        return [*ctx.prompt, {"role": "assistant", "content": answer}]


class AnsweredAtAll(Grader):
    """Reward 1 for any non-empty answer; records the label it saw."""

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        ctx.sample.metrics["label_seen"] = 1.0 if ctx.label else 0.0
        ctx.set_reward(1.0 if ctx.sample.messages[-1].get("content") else 0.0)


class Narrate(AgentWorkflow):
    """Grows its history for a few seconds (a previewable source), without the model."""

    async def run(self, ctx: AgentWorkflowContext) -> None:
        from osmosis_ai.testing import HistorySource

        source = HistorySource([*ctx.prompt])
        context = get_rollout_context()
        assert context is not None
        context.set_sample_source(source)
        for turn in range(6):
            await asyncio.sleep(0.5)
            source.messages.append({"role": "assistant", "content": f"turn {turn}"})
