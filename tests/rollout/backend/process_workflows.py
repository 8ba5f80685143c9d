"""Workflows the ProcessBackend tests run in child processes (importable there)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx2

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    Grader,
    GraderConfig,
    GraderContext,
    get_rollout_context,
)
from osmosis_ai.testing import HistorySource


class Settings(AgentWorkflowConfig):
    answer: str = "42"


class Behave(AgentWorkflow[Settings]):
    """Does what ``metadata["kind"]`` says; records its pid(s) in the artifacts dir."""

    async def run(self, ctx: AgentWorkflowContext[Settings]) -> Any:
        meta = ctx.metadata or {}
        kind = meta.get("kind", "answer")
        assert ctx.artifacts_dir is not None
        pids = [os.getpid()]
        if kind == "sleep_with_child":
            pids.append(subprocess.Popen(["sleep", "60"]).pid)
        (ctx.artifacts_dir / "pids").write_text(" ".join(map(str, pids)))
        if kind == "spin":
            while True:
                pass
        if kind in ("sleep", "sleep_with_child"):
            time.sleep(60)
        if kind == "async_sleep":
            await asyncio.sleep(60)
        if kind == "segfault":
            ctypes.string_at(0)
        if kind == "exit":
            os._exit(3)
        if kind == "hog":
            hoard = [bytearray(64 * 2**20) for _ in range(64)]  # 4 GiB, in 64 MiB blocks
            return [{"role": "assistant", "content": str(len(hoard))}]
        if kind == "write":
            Path(meta["path"]).write_text("escaped")
        if kind == "artifact":
            (ctx.artifacts_dir / "note.txt").write_text("kept")
        if kind == "raise":
            raise ValueError("bad tool input")
        if kind == "chat":
            context = get_rollout_context()
            assert context is not None
            async with httpx2.AsyncClient(timeout=10) as client:
                reply = await client.post(
                    f"{context.chat_completions_url}/chat/completions",
                    headers={"Authorization": f"Bearer {context.api_key}"},
                    json={"model": "m", "messages": ctx.prompt},
                )
            reply.raise_for_status()
            content = reply.json()["choices"][0]["message"]["content"]
            return [*ctx.prompt, {"role": "assistant", "content": content}]
        if kind == "connect":
            host, port = meta["address"]
            try:
                _, writer = await asyncio.open_connection(host, port)
                writer.close()
                reached = "reached"
            except OSError as exc:
                reached = f"unreachable: {type(exc).__name__}"
            return [{"role": "assistant", "content": reached}]
        if kind == "talk":
            source = HistorySource([*ctx.prompt])
            get_rollout_context().set_sample_source(source)  # type: ignore[union-attr]
            for turn in range(int(meta.get("turns", 3))):
                await asyncio.sleep(float(meta.get("pause", 0.3)))
                source.messages.append({"role": "assistant", "content": f"turn {turn}"})
            return None
        answer = self.config.answer if self.config else "42"
        return [*ctx.prompt, {"role": "assistant", "content": answer}]


class GraderSettings(GraderConfig):
    bonus: float = 0.0


class Match(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        meta = ctx.metadata or {}
        if meta.get("grade") == "spin":
            while True:
                pass
        bonus = self.config.bonus if isinstance(self.config, GraderSettings) else 0.0
        hit = ctx.sample.messages[-1]["content"] == ctx.label
        ctx.set_reward((1.0 if hit else 0.0) + bonus)
