"""Arithmetic answered directly, in one model call with no tool: the task of ``make bench-trl``.

The workflow sends the row's messages to the rollout's OpenAI-compatible endpoint once (the
trainer imposes the sampling: temperature and max_tokens); the grader scores the reply with
`arith_reward.score`, the reward TRL's side and the shared held-out evaluation use too.
"""

from __future__ import annotations

import os
from typing import Any

import httpx2
from arith_reward import score  # type: ignore[import-not-found,unused-ignore]

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.model_pool import tls_context
from osmosis_ai.rollout.server import create_rollout_server


class DirectAnswer(AgentWorkflow[AgentWorkflowConfig]):
    """One chat call; the reply is the sample."""

    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> list[dict[str, Any]]:
        rollout = get_rollout_context()
        assert rollout is not None, "run() is called inside a rollout context"
        messages = list(ctx.prompt)
        headers = {"Authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else {}
        # The process's one TLS context: a client that builds its own spends ~50 ms of CPU.
        async with httpx2.AsyncClient(timeout=300, verify=tls_context()) as http:
            response = await http.post(
                f"{rollout.chat_completions_url}/chat/completions",
                json={"model": "policy", "messages": messages},
                headers=headers,
            )
            response.raise_for_status()
        messages.append(response.json()["choices"][0]["message"])
        return messages


class ArithGrader(Grader):
    """`score` of the last reply against the row's ground truth."""

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        reply = ctx.sample.messages[-1].get("content") or ""
        ctx.set_reward(score(reply, str(ctx.label)))


backend = LocalBackend(workflow=DirectAnswer, grader=ArithGrader)
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))
