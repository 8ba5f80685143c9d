"""Integration fixtures: a real OpenAI-compatible stub and rollout contexts bound to it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from osmosis_ai.rollout import RolloutContext
from osmosis_ai.testing import ChatStub, StubReply

API_KEY = "sk-rollout-5e1d7c9a3b"


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
