"""The LiteLLM policy, routed by LiteLLM's own OpenAI provider to a real stub server."""

from __future__ import annotations

import pytest

from osmosis_ai.gateway import LiteLLMPolicy
from osmosis_ai.testing import ChatStub, StubFailure, StubReply
from tests.gateway.conftest import chat, serving, sse_events

CHAT = "/v1/rollouts/r1/chat/completions"


@pytest.fixture(autouse=True)
def local_cost_map(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")


async def test_completion_and_streaming_through_litellm() -> None:
    async with ChatStub() as stub:
        policy = LiteLLMPolicy(
            "openai/stub-model", api_key="sk-litellm-123", api_base=stub.base_url
        )
        async with serving(policy) as (gateway, http):
            stub.push(StubReply(content="hello there"))
            answer = (await http.post(CHAT, json=chat("hi", temperature=0.5))).json()
            stub.push(StubReply(content="one two"))
            streamed = (await http.post(CHAT, json=chat("hi", stream=True))).text
    assert answer["choices"][0]["message"]["content"] == "hello there"
    assert stub.requests[0]["body"]["model"] == "stub-model"
    assert stub.requests[0]["body"]["temperature"] == 0.5
    assert stub.requests[0]["headers"]["authorization"] == "Bearer sk-litellm-123"
    events = sse_events(streamed)
    text = "".join(c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"])
    assert text == "one two"


async def test_provider_errors_keep_their_status_and_hide_the_key() -> None:
    async with ChatStub() as stub:
        policy = LiteLLMPolicy(
            "openai/stub-model", api_key="sk-litellm-123", api_base=stub.base_url
        )
        async with serving(policy) as (gateway, http):
            stub.push(*[StubFailure(401, "key sk-litellm-123 is invalid")] * 5)
            response = await http.post(CHAT, json=chat())
    assert response.status_code == 401
    assert "sk-litellm-123" not in response.text


async def test_an_upstream_echoing_its_key_never_passes_it_on() -> None:
    async with ChatStub() as stub:
        policy = LiteLLMPolicy(
            "openai/stub-model", api_key="sk-litellm-123", api_base=stub.base_url
        )
        async with serving(policy) as (gateway, http):
            stub.push(StubReply(content="your key: sk-litellm-123"))
            answer = await http.post(CHAT, json=chat())
            stub.push(StubReply(content="your key: sk-litellm-123"))
            streamed = await http.post(CHAT, json=chat(stream=True))
    assert answer.json()["choices"][0]["message"]["content"] == "your key: [REDACTED]"
    assert "sk-litellm-123" not in streamed.text and "[REDACTED]" in streamed.text
