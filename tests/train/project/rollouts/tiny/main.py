"""A tiny training rollout: one model call; the reward varies with what was sampled."""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import httpx2

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    JudgeGrader,
    JudgeGraderConfig,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.server import create_rollout_server

#: Offered with ``tool_choice="required"`` to rows with ``tools`` metadata: every reply is
#: generated under the tool plan's grammar.
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


class Reply(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        die_at = (ctx.metadata or {}).get("die_at")
        if die_at is not None:  # the server dies on the die_at-th rollout of the run
            await asyncio.to_thread(_count, ctx.metadata or {})
        # A slow tool or environment set-up, before the model call.
        await asyncio.sleep(float((ctx.metadata or {}).get("sleep", 0)))
        if (ctx.metadata or {}).get("raise"):
            raise RuntimeError("the tool crashed")
        if (ctx.metadata or {}).get("no_call"):  # an agent that never reaches the policy
            return [*ctx.prompt, {"role": "assistant", "content": "done"}]
        rollout = get_rollout_context()
        assert rollout is not None
        body: dict[str, Any] = {"model": "policy", "messages": ctx.prompt}
        if (ctx.metadata or {}).get("tools"):
            body.update(tools=[CALCULATOR], tool_choice="required")
        body.update((ctx.metadata or {}).get("sampling") or {})  # the agent's own top_p...
        async with httpx2.AsyncClient(timeout=60) as http:
            response = await http.post(
                f"{rollout.chat_completions_url}/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {rollout.api_key}"},
            )
        response.raise_for_status()
        messages = [*ctx.prompt, response.json()["choices"][0]["message"]]
        if (ctx.metadata or {}).get("leak"):  # a careless agent: key and secret in its output
            secret = os.environ["TINY_SECRET"]
            print(f"debug {rollout.api_key} {secret}", flush=True)
            leak = {"role": "user", "content": f"key {rollout.api_key} secret {secret}"}
            messages.insert(-1, leak)  # the reply stays last: it is what the grader reads
            if ctx.artifacts_dir is not None:  # user files, copied into the run directory
                notes = ctx.artifacts_dir / "notes.txt"
                await asyncio.to_thread(notes.write_text, f"{rollout.api_key} {secret}")
        return messages


def _count(meta: dict[str, Any]) -> None:
    with open(meta["counter"], "a+") as file:
        file.write("x")
        file.seek(0)
        if len(file.read()) >= meta["die_at"]:
            os._exit(3)


class Length(Grader):
    """Deterministic in the text, so sampled replies of one row get different rewards.

    A row's ``reward`` metadata overrides it: every rollout of the row gets that reward.
    ``random_reward`` metadata draws each rollout's reward instead, so that a step always
    has groups to learn from (long replies capped at ``max_tokens`` may all be as long).
    ``random_turn_reward`` metadata draws a reward for the rollout's one model call.
    """

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        if (ctx.metadata or {}).get("random_turn_reward"):  # credit per turn: the one call's
            ctx.set_turn_reward(0, random.random())
        constant = (ctx.metadata or {}).get("reward")
        if constant is not None:
            ctx.set_reward(float(constant))
            return
        if (ctx.metadata or {}).get("random_reward"):
            ctx.set_reward(random.random())
            return
        answer = ctx.sample.messages[-1].get("content") or ""
        ctx.set_reward((len(answer) % 5) / 4)


if os.environ.get("TINY_GRADER") == "judge":  # the run's [judge] grades
    backend = LocalBackend(
        workflow=Reply,
        grader=JudgeGrader,
        grader_config=JudgeGraderConfig(rubric="How well does the reply count?"),
    )
else:
    backend = LocalBackend(workflow=Reply, grader=Length)
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(
        app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]), log_level="warning"
    )
