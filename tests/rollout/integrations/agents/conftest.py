"""Integration fixtures: a real OpenAI-compatible stub and rollout contexts bound to it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from osmosis_ai.gateway import Gateway, OpenAICompatiblePolicy
from osmosis_ai.rollout import RolloutContext
from osmosis_ai.testing import ChatStub, StubReply
from tests.eval.conftest import evaluate_example

API_KEY = "sk-rollout-5e1d7c9a3b"
#: The key a gateway in front of the stub sends it.
UPSTREAM_KEY = "sk-upstream-0c4f2a7e91"


@contextlib.asynccontextmanager
async def rollout(stub: ChatStub, rollout_id: str = "r1") -> AsyncIterator[RolloutContext]:
    """An active rollout context on ``stub``, cleaned up as a backend would."""
    with RolloutContext(
        chat_completions_url=stub.base_url, api_key=API_KEY, rollout_id=rollout_id
    ) as rollout_ctx:
        try:
            yield rollout_ctx
        finally:
            await rollout_ctx.run_cleanups()


@contextlib.asynccontextmanager
async def stub_gateway(stub: ChatStub) -> AsyncIterator[Gateway]:
    """A real gateway in front of ``stub``: rollouts speak any API the gateway serves (the
    OpenAI Agents SDK's Responses API), the stub sees the chat completions it translates to."""
    async with Gateway(OpenAICompatiblePolicy(stub.base_url, api_key=UPSTREAM_KEY)) as gateway:
        yield gateway


@contextlib.asynccontextmanager
async def gateway_rollout(stub: ChatStub, rollout_id: str = "r1") -> AsyncIterator[RolloutContext]:
    """An active rollout context on a `stub_gateway`, cleaned up as a backend would."""
    async with stub_gateway(stub) as gateway:
        with RolloutContext(
            chat_completions_url=gateway.chat_completions_url(rollout_id),
            api_key=gateway.token,
            rollout_id=rollout_id,
        ) as rollout_ctx:
            try:
                yield rollout_ctx
            finally:
                await rollout_ctx.run_cleanups()


def tool_call(name: str, arguments: dict[str, Any], call_id: str = "call_1") -> StubReply:
    """A stub reply that calls ``name`` once."""
    return StubReply(
        tool_calls=[
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ]
    )


async def check_example_evaluates(tmp_path: Path, example: str) -> None:
    """``osmosis eval run`` of ``examples/<example>`` as shipped, on 2 rows of the embedded
    model: both graded, no per-request log lines, and the chat messages ``run()`` returned as
    the trajectory (the agent's calls with the gateway's token ids, a tool call with its
    result)."""
    _, logs, agent = await evaluate_example(tmp_path, example)
    assert "HTTP Request: POST" not in logs and '"GET /rollout' not in logs, logs[-3000:]
    assert any(step.get("tool_calls") and step.get("observation") for step in agent)
