"""A rollout server for the side-by-side benchmark: ``_compare_server.py PORT KIND [documented]``.

Written against the API both SDKs share (the user guide's), so the same file runs under our
package and under the reference's — each interpreter brings its own ``osmosis_ai``. KIND:
``noop`` returns at once; ``chat3`` makes 3 chat calls with a raw HTTP client; ``strands1``
and ``strands3`` run a Strands agent (the SDK's integration) with one tool; the stub model
decides how many calls that makes (the benchmark points them at a stub for 1 or 3);
``idle`` waits so rollouts stay in flight. By default the backend gets a config without a
concurrency cap; with ``documented`` it is built as the user guide shows,
``LocalBackend(workflow=...)`` (the reference then runs 4 rollouts at a time).
"""

from __future__ import annotations

import asyncio
import resource
import sys
from typing import Any

import httpx2
import uvicorn

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.server import create_rollout_server

_HTTP: httpx2.AsyncClient | None = None


class NoOp(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> Any:
        return [*ctx.prompt, {"role": "assistant", "content": "done"}]


class Idle(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> Any:
        await asyncio.sleep(3600)
        return []


class Chat3(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> Any:
        global _HTTP
        rollout = get_rollout_context()
        assert rollout is not None
        if _HTTP is None:
            _HTTP = httpx2.AsyncClient(timeout=60, limits=httpx2.Limits(max_connections=1024))
        messages = list(ctx.prompt)
        for _ in range(3):
            reply = await _HTTP.post(
                f"{rollout.chat_completions_url}/chat/completions",
                headers={"Authorization": f"Bearer {rollout.api_key or 'x'}"},
                json={"model": "stub-model", "messages": messages},
            )
            messages.append(reply.json()["choices"][0]["message"])
        return messages


class StrandsAgent(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        from strands import tool

        from osmosis_ai.rollout.integrations.agents.strands import (
            OsmosisRolloutModel,
            OsmosisStrandsAgent,
        )

        @tool
        def step(n: int) -> str:
            """Advance one step."""
            return f"step {n}"

        agent = OsmosisStrandsAgent(
            name="bench-agent",
            model=OsmosisRolloutModel(params={"temperature": 0}),
            messages=ctx.prompt,
            tools=[step],
            callback_handler=None,
        )
        await agent.invoke_async()


WORKFLOWS = {
    "noop": NoOp,
    "idle": Idle,
    "chat3": Chat3,
    "strands1": StrandsAgent,
    "strands3": StrandsAgent,
}


def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    port, kind = int(sys.argv[1]), sys.argv[2]
    documented = sys.argv[3:] == ["documented"]
    # A config without a concurrency cap: the reference caps config-less backends at 4.
    config = None if documented else AgentWorkflowConfig(name=f"bench-{kind}")
    app = create_rollout_server(
        backend=LocalBackend(workflow=WORKFLOWS[kind], workflow_config=config),
        configure_logging=False,
        polling_lease_timeout_sec=600,
        result_wait_timeout_sec=300,
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", backlog=8192)


if __name__ == "__main__":
    main()
