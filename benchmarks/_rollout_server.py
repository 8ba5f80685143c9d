"""A rollout server child process for benchmarks: ``python _rollout_server.py PORT KIND``.

KIND ``noop`` returns at once; ``idle`` waits (up to an hour) so rollouts stay in flight.
"""

from __future__ import annotations

import asyncio
import resource
import sys
from typing import Any

import uvicorn

from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowContext, LocalBackend
from osmosis_ai.rollout.server import create_rollout_server


class NoOp(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": "done"}]


class Idle(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        await asyncio.sleep(3600)
        return []


def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    port, kind = int(sys.argv[1]), sys.argv[2]
    workflow = NoOp if kind == "noop" else Idle
    app = create_rollout_server(
        backend=LocalBackend(workflow=workflow),
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
