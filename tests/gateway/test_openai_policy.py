"""The gateway in front of an OpenAI-compatible upstream (a real stub server)."""

from __future__ import annotations

import json

import httpx2
import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway import Gateway, OpenAICompatiblePolicy
from osmosis_ai.testing import ChatStub, StubFailure, StubReply
from tests.gateway.conftest import PROVIDER_KEY, chat, serving, sse_events

CHAT = "/v1/rollouts/r1/chat/completions"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }
]


async def test_inference_fields_are_forwarded_unchanged(
    client: httpx2.AsyncClient, stub: ChatStub
) -> None:
    fields = {
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "add"}},
        "response_format": {"type": "json_object"},
        "stop": ["\n\n"],
        "seed": 7,
        "max_tokens": 33,
        "temperature": 0.3,
        "top_p": 0.9,
    }
    response = await client.post(CHAT, json=chat("hi", **fields))
    assert response.status_code == 200
    sent = stub.requests[-1]["body"]
    for name, value in fields.items():
        assert sent[name] == value
    assert sent["model"] == "stub-model"
    assert stub.requests[-1]["headers"]["authorization"] == f"Bearer {PROVIDER_KEY}"


async def test_extra_body_is_merged_into_the_request(
    client: httpx2.AsyncClient, stub: ChatStub
) -> None:
    await client.post(CHAT, json=chat("hi", extra_body={"top_k": 5}))
    assert stub.requests[-1]["body"]["top_k"] == 5


async def test_answer_and_call_record(client: httpx2.AsyncClient, stub: ChatStub) -> None:
    stub.push(
        StubReply(
            content="four", usage={"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}
        )
    )
    response = await client.post(CHAT, json=chat("2+2?"))
    body = response.json()
    assert body["choices"][0]["message"]["content"] == "four"
    calls = (await client.get("/v1/rollouts/r1/calls")).json()["calls"]
    assert len(calls) == 1
    call = calls[0]
    assert call["status"] == "ok" and call["index"] == 0 and call["stream"] is False
    assert call["usage"]["prompt_tokens"] == 9
    assert call["finish_reason"] == "stop"
    assert len(call["messages_sha256"]) == 64
    assert call["latency_ms"] >= 0


async def test_streaming_passes_chunks_and_usage_when_asked(
    client: httpx2.AsyncClient, stub: ChatStub
) -> None:
    stub.push(StubReply(content="one two three"))
    response = await client.post(
        CHAT, json=chat("count", stream=True, stream_options={"include_usage": True})
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    text = "".join(
        choice["delta"].get("content") or "" for event in events[:-1] for choice in event["choices"]
    )
    assert text == "one two three"
    assert events[-2]["usage"]["total_tokens"] == 10
    assert stub.requests[-1]["body"]["stream_options"]["include_usage"] is True


async def test_streaming_without_include_usage_hides_the_usage_chunk_but_records_it(
    client: httpx2.AsyncClient, stub: ChatStub
) -> None:
    response = await client.post(CHAT, json=chat("count", stream=True))
    events = sse_events(response.text)
    assert all("usage" not in event for event in events[:-1])
    (call,) = (await client.get("/v1/rollouts/r1/calls")).json()["calls"]
    assert call["stream"] is True and call["usage"]["total_tokens"] == 10


async def test_token_data_is_requested_and_recorded_but_only_returned_when_asked(
    stub: ChatStub,
) -> None:
    policy = OpenAICompatiblePolicy(stub.base_url, token_data=True)
    async with serving(policy) as (gateway, http):
        stub.push(StubReply(content="a b c"))
        answer = (await http.post(CHAT, json=chat("x"))).json()
        assert "prompt_token_ids" not in answer
        assert "logprobs" not in answer["choices"][0]
        stub.push(StubReply(content="a b c"))
        streamed = (await http.post(CHAT, json=chat("x", stream=True))).text
        assert "token_ids" not in streamed and "logprob" not in streamed
        calls = (await http.get("/v1/rollouts/r1/calls")).json()["calls"]
    assert stub.requests[0]["body"]["logprobs"] is True
    assert stub.requests[0]["body"]["return_token_ids"] is True
    for call in calls:
        assert call["prompt_token_ids"] == list(range(7))
        assert call["completion_token_ids"] == [100, 101, 102]
        assert call["logprobs"] == [-0.5, -0.5, -0.5]


async def test_caller_asking_for_logprobs_gets_them(client: httpx2.AsyncClient) -> None:
    answer = (await client.post(CHAT, json=chat("a b", logprobs=True))).json()
    assert answer["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.5


async def test_upstream_rate_limit_keeps_its_status(
    client: httpx2.AsyncClient, stub: ChatStub
) -> None:
    stub.push(StubFailure(429, "slow down"))
    response = await client.post(CHAT, json=chat())
    assert response.status_code == 429
    error = response.json()["error"]
    assert "slow down" in error["message"] and error["type"] == "upstream_request_error"
    (call,) = (await client.get("/v1/rollouts/r1/calls")).json()["calls"]
    assert call["status"] == "error" and "slow down" in call["error"]


async def test_upstream_server_error_becomes_502(
    client: httpx2.AsyncClient, stub: ChatStub
) -> None:
    stub.push(StubFailure(500, "kaboom"))
    response = await client.post(CHAT, json=chat())
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "upstream_error"


async def test_upstream_error_while_streaming_keeps_its_status(
    client: httpx2.AsyncClient, stub: ChatStub
) -> None:
    stub.push(StubFailure(503, "overloaded"))
    response = await client.post(CHAT, json=chat(stream=True))
    assert response.status_code == 502


async def test_upstream_timeout_becomes_504(stub: ChatStub) -> None:
    stub.push(StubReply(content="late", delay_sec=2))
    policy = OpenAICompatiblePolicy(stub.base_url, timeout_sec=0.2)
    async with serving(policy) as (gateway, http):
        response = await http.post(CHAT, json=chat())
        assert (await http.get("/health")).status_code == 200
    assert response.status_code == 504
    assert "timed out" in response.json()["error"]["message"]


async def test_unreachable_upstream_becomes_502() -> None:
    from osmosis_ai._serving import bind_socket

    unused = bind_socket()
    port = unused.getsockname()[1]
    unused.close()
    policy = OpenAICompatiblePolicy(f"http://127.0.0.1:{port}/v1", timeout_sec=2)
    async with serving(policy) as (gateway, http):
        response = await http.post(CHAT, json=chat())
    assert response.status_code == 502
    assert "unreachable" in response.json()["error"]["message"]


async def test_a_cookie_the_upstream_sets_is_not_sent_with_later_calls() -> None:
    # One pooled session serves every rollout: an upstream cookie must not cross rollouts.
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from osmosis_ai._serving import running_server

    cookies: list[str | None] = []

    async def answer(request: Request) -> JSONResponse:
        cookies.append(request.headers.get("cookie"))
        message = {"role": "assistant", "content": "ok"}
        body = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
        response = JSONResponse(body)
        response.set_cookie("route", "rollout-a")
        return response

    upstream = Starlette(routes=[Route("/v1/chat/completions", answer, methods=["POST"])])
    async with running_server(upstream) as server:
        # A host name: a cookie jar (aiohttp's, for one) keeps no cookie for an IP address.
        policy = OpenAICompatiblePolicy(f"http://localhost:{server.port}/v1", model="m")
        async with serving(policy) as (_, http):
            first = await http.post("/v1/rollouts/a/chat/completions", json=chat())
            second = await http.post("/v1/rollouts/b/chat/completions", json=chat())
    assert first.status_code == second.status_code == 200
    assert "set-cookie" not in first.headers
    assert cookies == [None, None]


async def test_secrets_echoed_by_the_upstream_are_redacted(
    client: httpx2.AsyncClient, stub: ChatStub, gateway: Gateway
) -> None:
    stub.push(
        StubFailure(401, f"bad key {PROVIDER_KEY} (gateway token was {gateway.token})"),
        StubFailure(500, f"Authorization: Bearer {PROVIDER_KEY}"),
    )
    for _ in range(2):
        response = await client.post(CHAT, json=chat())
        assert PROVIDER_KEY not in response.text and gateway.token not in response.text
        assert "[REDACTED]" in response.text
    calls = (await client.get("/v1/rollouts/r1/calls")).text
    assert PROVIDER_KEY not in calls and gateway.token not in calls


async def test_an_upstream_echoing_its_key_never_passes_it_on(
    client: httpx2.AsyncClient, stub: ChatStub
) -> None:
    echo = f"you called me with Bearer {PROVIDER_KEY}!"
    call = {"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": json.dumps({"key": PROVIDER_KEY})}}  # fmt: skip
    stub.push(StubReply(content=echo, tool_calls=[call]), StubReply(content=echo))
    answer = await client.post(CHAT, json=chat(model=f"m-{PROVIDER_KEY}"))
    streamed = await client.post(CHAT, json=chat(stream=True, model=f"m-{PROVIDER_KEY}"))
    assert answer.status_code == 200 and streamed.status_code == 200
    for response in (answer, streamed):
        assert PROVIDER_KEY not in response.text and "[REDACTED]" in response.text
    message = answer.json()["choices"][0]["message"]
    assert message["content"] == "you called me with Bearer [REDACTED]!"  # only the key goes
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"key": "[REDACTED]"}
    for path in ("/v1/rollouts/r1/calls", "/v1/rollouts/r1/trajectory-report"):
        recorded = (await client.get(path)).text
        assert PROVIDER_KEY not in recorded and "m-[REDACTED]" in recorded


async def test_a_streamed_key_split_across_chunks_is_scrubbed(stub: ChatStub) -> None:
    key = "sk-split key-9c1e5d"  # the stub streams word by word: the key spans two chunks
    policy = OpenAICompatiblePolicy(stub.base_url, api_key=key, timeout_sec=5)
    async with serving(policy) as (_, http):
        stub.push(StubReply(content=f"you sent {key} to me"))
        streamed = await http.post(CHAT, json=chat(stream=True))
    events = sse_events(streamed.text)
    pieces = [c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"]]
    assert "".join(pieces) == "you sent [REDACTED] to me"
    assert "sk-split" not in streamed.text and "key-9c1e5d" not in streamed.text


async def test_long_upstream_errors_are_capped(client: httpx2.AsyncClient, stub: ChatStub) -> None:
    stub.push(StubFailure(400, "x" * 5000))
    response = await client.post(CHAT, json=chat())
    assert response.status_code == 400
    assert len(response.json()["error"]["message"]) <= 1001


async def test_records_are_per_rollout_and_can_be_released(
    client: httpx2.AsyncClient, gateway: Gateway
) -> None:
    for rollout in ("a", "a", "b"):
        await client.post(f"/v1/rollouts/{rollout}/chat/completions", json=chat())
    assert [c.index for c in gateway.records.calls("a")] == [0, 1]
    report = gateway.records.report("a")
    assert report is not None
    (sample,) = report.samples.values()
    assert len(sample.llm_call_metrics) == 2
    released = (await client.delete("/v1/rollouts/a/calls")).json()
    assert released == {"rollout_id": "a", "released": 2}
    assert (await client.get("/v1/rollouts/a/calls")).json()["calls"] == []
    assert len(gateway.records.calls("b")) == 1


async def test_models_and_health(client: httpx2.AsyncClient) -> None:
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list" and models["data"][0]["object"] == "model"
    health = (await client.get("/health")).json()
    assert health["status"] == "ok" and health["policy"] == "openai"


async def test_upstream_without_a_model_needs_one_in_the_request(stub: ChatStub) -> None:
    async with serving(OpenAICompatiblePolicy(stub.base_url)) as (gateway, http):
        body = chat()
        del body["model"]
        response = await http.post(CHAT, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "model"


async def test_configured_model_overrides_the_callers(stub: ChatStub) -> None:
    async with serving(OpenAICompatiblePolicy(stub.base_url, model="served")) as (gateway, http):
        await http.post(CHAT, json=chat())
    assert stub.requests[-1]["body"]["model"] == "served"


async def test_gateway_sampling_replaces_the_callers(stub: ChatStub) -> None:
    sampling = {"temperature": 0.0, "max_tokens": 5, "seed": 3}
    async with serving(OpenAICompatiblePolicy(stub.base_url), sampling=sampling) as (_, http):
        await http.post(CHAT, json=chat(temperature=1.5, max_completion_tokens=4096, top_p=0.5))
    sent = stub.requests[-1]["body"]
    assert {k: sent[k] for k in sampling} == sampling
    assert sent["top_p"] == 0.5 and "max_completion_tokens" not in sent


async def test_gateway_sampling_can_change_between_phases(stub: ChatStub) -> None:
    async with serving(OpenAICompatiblePolicy(stub.base_url), sampling={"temperature": 1.0}) as (
        gateway,
        http,
    ):
        await http.post(CHAT, json=chat(temperature=0.3))
        gateway.sampling = {"temperature": 0.0, "max_tokens": 7}
        assert gateway.sampling == {"temperature": 0.0, "max_tokens": 7}
        await http.post(CHAT, json=chat(temperature=0.3))
        with pytest.raises(ConfigError, match="top_q"):
            gateway.sampling = {"top_q": 1}
        gateway.sampling = {}
        await http.post(CHAT, json=chat(temperature=0.3))
    sent = [request["body"] for request in stub.requests[-3:]]
    assert sent[0]["temperature"] == 1.0
    assert (sent[1]["temperature"], sent[1]["max_tokens"]) == (0.0, 7)
    assert sent[2]["temperature"] == 0.3  # the caller's own again


async def test_sampling_imposed_on_one_rollout_leaves_the_others_alone(stub: ChatStub) -> None:
    """A trainer's greedy held-out rollouts run beside its training rollouts: the sampling
    imposed on a rollout holds for its calls alone, until its records are released."""
    async with serving(OpenAICompatiblePolicy(stub.base_url), sampling={"temperature": 1.0}) as (
        gateway,
        http,
    ):
        gateway.impose_sampling("held-out", {"temperature": 0.0, "max_tokens": 3})
        await http.post("/v1/rollouts/held-out/chat/completions", json=chat())
        await http.post(CHAT, json=chat())
        with pytest.raises(ConfigError, match="top_q"):
            gateway.impose_sampling("held-out", {"top_q": 1})
        gateway.records.release("held-out")
        await http.post("/v1/rollouts/held-out/chat/completions", json=chat())
    sent = [request["body"] for request in stub.requests[-3:]]
    assert (sent[0]["temperature"], sent[0]["max_tokens"]) == (0.0, 3)
    assert sent[1]["temperature"] == 1.0
    assert sent[2]["temperature"] == 1.0  # released: the gateway's own again


async def test_trajectory_report_endpoint_serves_recorded_calls(
    client: httpx2.AsyncClient, gateway: Gateway
) -> None:
    assert (await client.get("/v1/rollouts/r1/trajectory-report")).status_code == 404
    await client.post(CHAT, json=chat("a"))
    await client.post(CHAT, json=chat("b"))
    response = await client.get(gateway.trajectory_report_url("r1").removeprefix(gateway.base_url))
    assert response.status_code == 200
    report = response.json()
    assert len(report["samples"]["r1"]["llm_call_metrics"]) == 2
    assert report["samples"]["r1"]["llm_call_metrics"][0]["prompt_tokens"] == 7


class _BrokenPolicy(OpenAICompatiblePolicy):
    async def complete(self, request: object) -> dict[str, object]:
        raise RuntimeError(f"bug near key {PROVIDER_KEY}")

    async def stream(self, request: object):
        yield {"choices": [{"index": 0, "delta": {"content": "a"}}]}
        raise RuntimeError(f"bug near key {PROVIDER_KEY}")


async def test_unexpected_policy_failures_are_opaque_500s_and_never_logged_raw(
    stub: ChatStub, caplog: pytest.LogCaptureFixture
) -> None:
    policy = _BrokenPolicy(stub.base_url, api_key=PROVIDER_KEY)
    async with serving(policy) as (gateway, http):
        plain = await http.post(CHAT, json=chat())
        streamed = await http.post(CHAT, json=chat(stream=True))
        calls = (await http.get("/v1/rollouts/r1/calls")).json()["calls"]
    assert plain.status_code == 500 and plain.json()["error"]["type"] == "internal_error"
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]" and events[-2]["error"]["type"] == "internal_error"
    assert [call["status"] for call in calls] == ["error", "error"]
    assert calls[1]["error"] == "bug near key [REDACTED]"  # not "the caller disconnected"
    assert PROVIDER_KEY not in caplog.text and PROVIDER_KEY not in json.dumps(calls)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"api_key": "sk-line-ending-secret\n"}, "Authorization"),
        ({"session_header": "X Session"}, "not a header name"),
        ({"session_header": "X-Session:"}, "not a header name"),
    ],
)
def test_keys_and_header_names_that_cannot_be_sent_are_config_errors(
    options: dict[str, str], fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment) as caught:
        OpenAICompatiblePolicy("http://127.0.0.1:9/v1", **options)  # type: ignore[arg-type]
    assert "sk-line-ending-secret" not in str(caught.value)
