"""Anthropic's Messages API on the gateway, through the official ``anthropic`` client: tool use
in both modes on the embedded model and the torch engine, streamed records equal to
non-streamed ones, the client's own errors for bad input; and the pure translation."""

from __future__ import annotations

import itertools
from typing import Any

import anthropic
import httpx2
import pytest

from osmosis_ai.errors import ChatRequestError
from osmosis_ai.gateway import Gateway
from osmosis_ai.gateway.apis import chat_payload_of_messages_request
from osmosis_ai.rollout.types import RolloutResultResponse
from osmosis_ai.train import RolloutRecords, build_sequences
from tests.gateway.apis.conftest import DESCRIPTION, PARAMETERS

#: The tests that call a served gateway share its event loop.
served = pytest.mark.asyncio(loop_scope="module")

TOOL = {"name": "calculator", "description": DESCRIPTION, "input_schema": PARAMETERS}
QUESTION = "What is 2+3? Use the calculator."
SYSTEM = "Use the tool."
_ROLLOUTS = itertools.count()


def _client(gateway: Gateway, rollout: str, key: str | None = None) -> anthropic.AsyncAnthropic:
    # The client posts to <base_url>/v1/messages with the key as x-api-key.
    return anthropic.AsyncAnthropic(
        base_url=gateway.chat_completions_url(rollout), api_key=key or gateway.token,
        max_retries=0,
    )  # fmt: skip


async def _create(client: anthropic.AsyncAnthropic, stream: bool, **body: Any) -> Any:
    """``messages.create``; streamed, through the client's own accumulating stream."""
    if not stream:
        return await client.messages.create(**body)
    kinds = []
    async with client.messages.stream(**body) as events:
        async for event in events:
            kinds.append(event.type)
        final = await events.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    return final


@served
@pytest.mark.parametrize("stream", [False, True])
async def test_tool_use_its_result_and_an_answer_are_recorded_and_chain(
    gateway: Gateway, stream: bool
) -> None:
    rollout = f"tools-{next(_ROLLOUTS)}"
    async with _client(gateway, rollout) as client:
        first = await _create(
            client, stream, model="m", max_tokens=160, system=SYSTEM, tools=[TOOL],
            tool_choice={"type": "any"}, extra_body={"temperature": 0},
            messages=[{"role": "user", "content": QUESTION}],
        )  # fmt: skip
        assert first.stop_reason == "tool_use"
        (use,) = [block for block in first.content if block.type == "tool_use"]
        assert use.name == "calculator" and isinstance(use.input, dict)
        assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
        reply = [block.model_dump(exclude_none=True) for block in first.content]
        output = {"type": "tool_result", "tool_use_id": use.id, "content": "5"}
        turns = [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": [output]},
        ]
        second = await _create(
            client, stream, model="m", max_tokens=24, system=SYSTEM, tools=[TOOL], messages=turns
        )
        assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    records = gateway.records.calls(rollout)
    assert [(r.status, r.stream) for r in records] == [("ok", stream)] * 2
    assert all(r.prompt_token_ids and r.completion_token_ids and r.logprobs for r in records)
    if gateway.policy.kind == "torch":  # the engine replays exact history: one sequence
        result = RolloutResultResponse(rollout_id=rollout, status="success", sample={"reward": 1})
        _, stats = build_sequences([RolloutRecords(result, "g", records)])
        assert (stats.sequences, stats.merges, stats.drift, stats.new_contexts) == (1, 1, 0, 0)


@served
async def test_streamed_tool_use_records_the_ids_and_logprobs_of_a_non_streamed_one(
    gateway: Gateway,
) -> None:
    records = []
    # llama.cpp's logprobs for a prompt it prefilled cold differ from those for the same
    # prompt taken from its cache: a first call warms the cache for both.
    for stream in (False, False, True):
        rollout = f"same-{next(_ROLLOUTS)}"
        async with _client(gateway, rollout) as client:
            await _create(
                client, stream, model="m", max_tokens=160, tools=[TOOL],
                extra_body={"temperature": 0}, tool_choice={"type": "any"},
                messages=[{"role": "user", "content": QUESTION}],
            )  # fmt: skip
        (record,) = gateway.records.calls(rollout)
        records.append(record)
    _, plain, streamed = records
    assert streamed.stream and not plain.stream
    assert streamed.prompt_token_ids == plain.prompt_token_ids
    assert streamed.completion_token_ids == plain.completion_token_ids
    assert streamed.logprobs == pytest.approx(plain.logprobs, abs=1e-5)


@served
@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": []}, "'messages'"),
        ({"messages": [{"role": "user", "content": "x"}], "extra_body": {"temperature": 7}},
         "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "extra_body": {"api_base": "h"}},
         "api_base"),
        (
            {"messages": [{"role": "user", "content": "x"}],
             "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools[0]",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "document"}]}]}, "document"),
    ],
)  # fmt: skip
async def test_bad_input_raises_the_clients_own_error(
    gateway: Gateway, body: dict[str, Any], says: str
) -> None:
    async with _client(gateway, "bad") as client:
        with pytest.raises(anthropic.BadRequestError) as raised:
            await client.messages.create(model="m", max_tokens=8, **body)
    assert raised.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert says in str(raised.value)
    assert gateway.records.calls("bad") == []


@served
async def test_a_missing_max_tokens_and_a_wrong_key_are_answered_as_anthropic_does(
    gateway: Gateway,
) -> None:
    url = f"{gateway.chat_completions_url('bad')}/v1/messages"
    turns: Any = [{"role": "user", "content": "x"}]
    body = {"model": "m", "messages": turns}
    async with httpx2.AsyncClient() as http:
        missing = await http.post(url, json=body, headers={"x-api-key": gateway.token})
    assert missing.status_code == 400
    assert missing.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": missing.json()["error"]["message"]},
    }
    assert "max_tokens" in missing.json()["error"]["message"]
    async with _client(gateway, "bad", key="wrong") as client:
        with pytest.raises(anthropic.AuthenticationError) as raised:
            await client.messages.create(model="m", max_tokens=8, messages=turns)
    assert raised.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_content_blocks_become_chat_messages() -> None:
    body = chat_payload_of_messages_request(
        {
            "model": "m",
            "max_tokens": 32,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "2+3 and 2+4?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "two calls", "signature": "s"},
                    {"type": "text", "text": "Adding."},
                    {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 2, "b": 3}},
                    {"type": "tool_use", "id": "t2", "name": "add", "input": {"a": 2, "b": 4}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "5"},
                    {"type": "tool_result", "tool_use_id": "t2",
                     "content": [{"type": "text", "text": "6"}]},
                    {"type": "text", "text": "Now sum them."},
                ]},
            ],
            "tools": [TOOL],
            "tool_choice": {"type": "tool", "name": "calculator"},
            "stop_sequences": ["END"],
            "top_k": 5,
            "output_config": {"effort": "low",
                              "format": {"type": "json_schema", "schema": {"type": "object"}}},
            "metadata": {"user_id": "u"},
            "stream": True,
        }
    )  # fmt: skip
    calls = [
        {"id": f"t{n}", "type": "function",
         "function": {"name": "add", "arguments": f'{{"a": 2, "b": {n + 2}}}'}}
        for n in (1, 2)
    ]  # fmt: skip
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+3 and 2+4?"},
        {"role": "assistant", "content": "Adding.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "t1", "content": "5"},
        {"role": "tool", "tool_call_id": "t2", "content": "6"},
        {"role": "user", "content": "Now sum them."},
    ]
    assert body["tools"] == [
        {"type": "function", "function": {"name": "calculator", "parameters": PARAMETERS,
                                          "description": DESCRIPTION}}
    ]  # fmt: skip
    assert body["tool_choice"] == {"type": "function", "function": {"name": "calculator"}}
    assert (body["stop"], body["top_k"], body["max_tokens"]) == (["END"], 5, 32)
    assert body["stream_options"] == {"include_usage": True} and "metadata" not in body
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}


@pytest.mark.parametrize(
    ("choice", "chat"), [("auto", "auto"), ("any", "required"), ("none", "none")]
)
def test_tool_choice_modes(choice: str, chat: str) -> None:
    body = chat_payload_of_messages_request(
        {"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "tools": [TOOL],
         "tool_choice": {"type": choice}}
    )  # fmt: skip
    assert body["tool_choice"] == chat


def test_an_image_block_becomes_an_image_part() -> None:
    body = chat_payload_of_messages_request(
        {"max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AAAA"}},
        ]}]}
    )  # fmt: skip
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 8, "messages": "x"}, "messages"),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "content": "5"}]}]}, "messages[0].content[0]"),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
          "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ],
)  # fmt: skip
def test_what_the_gateway_cannot_serve_is_refused_naming_the_field(
    payload: dict[str, Any], param: str
) -> None:
    with pytest.raises(ChatRequestError) as raised:
        chat_payload_of_messages_request(payload)
    assert raised.value.param == param and raised.value.status_code == 400
