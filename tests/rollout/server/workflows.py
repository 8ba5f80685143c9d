"""Workflows and graders the server tests run (importable by child processes too)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    ConcurrencyConfig,
    Grader,
    GraderContext,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.testing import HistorySource


class Answer(AgentWorkflow):
    """Answers "42" after the delay given in metadata (default none)."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        delay = (ctx.metadata or {}).get("delay", 0)
        if delay:
            await asyncio.sleep(delay)
        return [*ctx.prompt, {"role": "assistant", "content": "42"}]


class ExactMatch(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)


class SlowGrader(ExactMatch):
    async def grade(self, ctx: GraderContext) -> None:
        await asyncio.sleep(float((ctx.metadata or {}).get("grade_delay", 0.3)))
        await super().grade(ctx)


class Behaviours(AgentWorkflow):
    """Does what ``metadata["do"]`` says: raise, hang, block, leak the key."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        what = (ctx.metadata or {}).get("do")
        if what == "raise":
            raise RuntimeError("the tool exploded")
        if what == "hang":
            await asyncio.sleep(3600)
        if what == "block":
            time.sleep(float((ctx.metadata or {}).get("seconds", 2)))  # noqa: ASYNC251 -- on purpose
        if what == "leak":
            context = get_rollout_context()
            assert context is not None
            raise RuntimeError(f"upstream rejected key {context.api_key}")
        if what == "leak_secrets":
            # A database error quoting the configured secrets, and the rollout's key.
            context = get_rollout_context()
            assert context is not None
            metadata = ctx.metadata or {}
            raise RuntimeError(
                f"db rejected {metadata['secret']} and {os.environ[metadata['secret_env']]} "
                f"(key {context.api_key})"
            )
        return [*ctx.prompt, {"role": "assistant", "content": "42"}]


class QueueingBackend(LocalBackend):
    """Admits everything and queues beyond its cap (like a backend with its own queue)."""

    def has_capacity(self) -> bool:
        return True


class OneAtATime(AgentWorkflowConfig):
    name: str = "one-at-a-time"
    concurrency: ConcurrencyConfig = ConcurrencyConfig(max_concurrent=1)


one_at_a_time = OneAtATime()


#: The sources of the Talking rollouts, by rollout id (tests inspect them).
SOURCES: dict[str, HistorySource] = {}


class Talking(AgentWorkflow):
    """Adds a message every ``pause`` seconds, ``turns`` times (metadata), then returns None.

    ``opt_out`` in metadata: ``"before"`` turns previews off before the first await,
    ``"after"`` after the first turn. A ``say`` string is put into every message.
    """

    async def run(self, ctx: AgentWorkflowContext) -> None:
        meta = ctx.metadata or {}
        rollout_ctx = get_rollout_context()
        assert rollout_ctx is not None
        if meta.get("opt_out") == "before":
            rollout_ctx.preview_enabled = False
        source = HistorySource(revision=meta.get("revision", True))
        SOURCES[rollout_ctx.rollout_id] = source
        rollout_ctx.set_sample_source(source)
        source.messages.extend(ctx.prompt)
        for turn in range(int(meta.get("turns", 3))):
            await asyncio.sleep(float(meta.get("pause", 0.2)))
            source.messages.append(
                {"role": "assistant", "content": f"turn {turn} {meta.get('say', '')}"}
            )
            if meta.get("opt_out") == "after" and turn == 0:
                await asyncio.sleep(float(meta.get("pause", 0.2)))
                rollout_ctx.preview_enabled = False
