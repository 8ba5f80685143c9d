"""Model preflight: one tiny completion, failures classified."""

from __future__ import annotations

import pytest

from osmosis_ai._serving import bind_socket
from osmosis_ai.gateway import OpenAICompatiblePolicy, preflight
from osmosis_ai.testing import ChatStub, StubFailure


@pytest.mark.parametrize(
    ("status", "category", "fatal"),
    [
        (401, "auth", True),
        (403, "auth", True),
        (404, "model_not_found", True),
        (400, "bad_request", True),
        (429, "rate_limited", False),
        (500, "unreachable", True),
        (418, "error", False),
    ],
)
async def test_failures_are_classified(status: int, category: str, fatal: bool) -> None:
    async with ChatStub() as stub:
        stub.push(StubFailure(status, "nope sk-preflight-key"))
        policy = OpenAICompatiblePolicy(stub.base_url, model="m", api_key="sk-preflight-key")
        await policy.start()
        try:
            result = await preflight(policy)
        finally:
            await policy.aclose()
    assert result.category == category and result.fatal is fatal and not result.ok
    assert "sk-preflight-key" not in result.message


async def test_working_model_passes() -> None:
    async with ChatStub() as stub:
        policy = OpenAICompatiblePolicy(stub.base_url, model="m")
        await policy.start()
        result = await preflight(policy)
        await policy.aclose()
    assert result.ok and not result.fatal
    assert stub.requests[0]["body"]["max_tokens"] == 1


async def test_unreachable_server_is_fatal() -> None:
    unused = bind_socket()
    port = unused.getsockname()[1]
    unused.close()
    policy = OpenAICompatiblePolicy(f"http://127.0.0.1:{port}/v1", model="m", timeout_sec=2)
    await policy.start()
    result = await preflight(policy)
    await policy.aclose()
    assert result.category == "unreachable" and result.fatal
