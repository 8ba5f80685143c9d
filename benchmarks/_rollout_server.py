"""A rollout server child process for benchmarks: ``python _rollout_server.py PORT KIND``.

KIND ``noop`` returns at once; ``idle`` waits (up to an hour) so rollouts stay in flight;
``talking`` adds a 400-character message every ``TALK_PAUSE_SEC`` for ``TALK_TURNS`` turns
to a previewable history (live previews follow ``$_OSMOSIS_ROLLOUT_PREVIEW_ROOT``).
"""

from __future__ import annotations

import asyncio
import os
import resource
import sys
from typing import Any

import uvicorn

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.testing import HistorySource

TALK_TURNS = 8
TALK_PAUSE_SEC = 2.5


class NoOp(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": "done"}]


class Idle(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        await asyncio.sleep(3600)
        return []


class Talking(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        rollout = get_rollout_context()
        assert rollout is not None
        history = HistorySource(ctx.prompt)
        rollout.set_sample_source(history)
        for turn in range(TALK_TURNS):
            await asyncio.sleep(TALK_PAUSE_SEC)
            text = f"turn {turn}: " + "lorem ipsum dolor sit amet " * 15
            history.messages.append({"role": "assistant", "content": text})


WORKFLOWS = {"noop": NoOp, "idle": Idle, "talking": Talking}


def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    port, kind = int(sys.argv[1]), sys.argv[2]
    workflow = WORKFLOWS[kind]
    app = create_rollout_server(
        backend=LocalBackend(workflow=workflow),
        # "http": previews served over HTTP only; otherwise they follow the preview root.
        previews=True if os.environ.get("BENCH_PREVIEWS") == "http" else None,
        configure_logging=False,
        polling_lease_timeout_sec=600,
        result_wait_timeout_sec=300,
    )
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        backlog=8192,
        timeout_keep_alive=120,
    )


if __name__ == "__main__":
    main()
