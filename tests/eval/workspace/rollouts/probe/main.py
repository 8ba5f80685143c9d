"""A test rollout: one chat call through the rollout's endpoint, behaviour chosen per row."""

from __future__ import annotations

import os
from typing import Any

import httpx

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.server import create_rollout_server


class Probe(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        what = (ctx.metadata or {}).get("do")
        if what == "kill_server":
            os._exit(3)
        if what == "print_long":
            print("x" * 300_000, flush=True)  # longer than any line buffer
            for index in range(2000):
                print(f"line {index}", flush=True)
        if what == "print_secret":
            print(f"the secret is {os.environ['PROBE_SECRET']}", flush=True)
        rollout = get_rollout_context()
        assert rollout is not None
        async with httpx.AsyncClient(timeout=60) as http:
            response = await http.post(
                f"{rollout.chat_completions_url}/chat/completions",
                json={"model": "policy", "messages": ctx.prompt},
                headers={"Authorization": f"Bearer {rollout.api_key}"},
            )
        response.raise_for_status()
        return [*ctx.prompt, response.json()["choices"][0]["message"]]


class Contains(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        what = (ctx.metadata or {}).get("do")
        if what == "crash_grader":
            raise RuntimeError("grader crashed")
        if what == "remove":
            ctx.sample.remove_sample = True
            return
        answer = ctx.sample.messages[-1].get("content") or ""
        ctx.set_reward(1.0 if (ctx.label or "") in answer else 0.0)


app = create_rollout_server(backend=LocalBackend(workflow=Probe, grader=Contains))

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(
        app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]), log_level="warning"
    )
