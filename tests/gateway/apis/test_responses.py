"""OpenAI's Responses API on the gateway, through the official ``openai`` client: tool calls in
both modes on the embedded model and the torch engine, streamed records equal to
non-streamed ones, the client's own errors for bad input; and the pure translation."""

from __future__ import annotations

import itertools
from typing import Any

import openai
import pytest

from osmosis_ai.errors import ChatRequestError
from osmosis_ai.gateway import Gateway
from osmosis_ai.gateway.apis import chat_payload_of_response_request
from osmosis_ai.rollout.types import RolloutResultResponse
from osmosis_ai.train import RolloutRecords, build_sequences
from tests.gateway.apis.conftest import DESCRIPTION, PARAMETERS

#: The tests that call a served gateway share its event loop.
served = pytest.mark.asyncio(loop_scope="module")

TOOL = {"type": "function", "name": "calculator", "description": DESCRIPTION,
        "parameters": PARAMETERS}  # fmt: skip
QUESTION = "What is 2+3? Use the calculator."
_ROLLOUTS = itertools.count()


def _client(gateway: Gateway, rollout: str, key: str | None = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=gateway.chat_completions_url(rollout), api_key=key or gateway.token,
        max_retries=0,
    )  # fmt: skip


async def _create(client: openai.AsyncOpenAI, stream: bool, **body: Any) -> Any:
    """``responses.create``; streamed, the events' types and the final response."""
    if not stream:
        return await client.responses.create(**body)
    kinds, final = [], None
    async for event in await client.responses.create(stream=True, **body):
        kinds.append(event.type)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert final is not None and kinds[-1] == f"response.{final.status}", kinds
    return final


@served
@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_call_its_output_and_an_answer_are_recorded_and_chain(
    gateway: Gateway, stream: bool
) -> None:
    rollout = f"tools-{next(_ROLLOUTS)}"
    async with _client(gateway, rollout) as client:
        first, second = await _round_trip(client, stream)
    records = gateway.records.calls(rollout)
    assert [(r.status, r.stream) for r in records] == [("ok", stream)] * 2
    assert all(r.prompt_token_ids and r.completion_token_ids and r.logprobs for r in records)
    if gateway.policy.kind == "torch":  # the engine replays exact history: one sequence
        result = RolloutResultResponse(rollout_id=rollout, status="success", sample={"reward": 1})
        _, stats = build_sequences([RolloutRecords(result, "g", records)])
        assert (stats.sequences, stats.merges, stats.drift, stats.new_contexts) == (1, 1, 0, 0)


async def _round_trip(client: openai.AsyncOpenAI, stream: bool) -> tuple[Any, Any]:
    """A forced tool call, then the answer after its output."""
    first = await _create(
        client, stream, model="m", input=QUESTION, tools=[TOOL], tool_choice="required",
        max_output_tokens=160, temperature=0, instructions="Use the tool.",
    )  # fmt: skip
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "calculator" and call.status == "completed"
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    items = [
        {"role": "user", "content": QUESTION},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "5"},
    ]
    second = await _create(
        client, stream, model="m", input=items, tools=[TOOL], max_output_tokens=24,
        instructions="Use the tool.",
    )  # fmt: skip
    assert second.output and second.usage.output_tokens > 0
    return first, second


@served
async def test_a_streamed_tool_call_records_the_ids_and_logprobs_of_a_non_streamed_one(
    gateway: Gateway,
) -> None:
    records = []
    # llama.cpp's logprobs for a prompt it prefilled cold differ (by up to ~0.2) from those
    # for the same prompt taken from its cache: a first call warms the cache for both.
    for stream in (False, False, True):
        rollout = f"same-{next(_ROLLOUTS)}"
        async with _client(gateway, rollout) as client:
            await _create(
                client, stream, model="m", input=QUESTION, tools=[TOOL],
                tool_choice="required", max_output_tokens=160, temperature=0,
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
    ("body", "error", "says"),
    [
        ({"input": [{"type": "web_search_call"}]}, openai.BadRequestError, "input[0]"),
        ({"input": "x", "previous_response_id": "resp_1"}, openai.BadRequestError, "stores no"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, openai.BadRequestError, "tools[0]"),
        ({"input": []}, openai.BadRequestError, "'input'"),
        ({"input": "x", "temperature": 7}, openai.BadRequestError, "temperature"),
        ({"input": [{"role": "robot", "content": "x"}]}, openai.BadRequestError, "role"),
    ],
)
async def test_bad_input_raises_the_clients_own_error(
    gateway: Gateway, body: dict[str, Any], error: type[Exception], says: str
) -> None:
    async with _client(gateway, "bad") as client:
        with pytest.raises(error) as raised:
            await client.responses.create(model="m", **body)
    assert says in str(raised.value)
    assert gateway.records.calls("bad") == []


@served
async def test_a_wrong_key_is_an_authentication_error(gateway: Gateway) -> None:
    async with _client(gateway, "bad", key="wrong") as client:
        with pytest.raises(openai.AuthenticationError):
            await client.responses.create(model="m", input="x")


def test_input_items_become_chat_messages_with_each_reply_whole() -> None:
    body = chat_payload_of_response_request(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "2+3?"}]},
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                 "content": [{"type": "output_text", "text": "Let me add.", "annotations": []}]},
                {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "add", "arguments": "{}"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call_output", "call_id": "c1", "output": "5"},
                {"type": "function_call_output", "call_id": "c2",
                 "output": [{"type": "input_text", "text": "6"}]},
            ],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "name": "calculator"},
            "max_output_tokens": 32,
            "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
            "store": False,
            "include": ["reasoning.encrypted_content"],
            "stream": True,
        }
    )  # fmt: skip
    calls = [
        {"id": cid, "type": "function", "function": {"name": "add", "arguments": "{}"}}
        for cid in ("c1", "c2")
    ]
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "Let me add.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c2", "content": "6"},
    ]
    assert body["tools"] == [
        {"type": "function", "function": {"name": "calculator", "parameters": PARAMETERS,
                                          "description": DESCRIPTION}}
    ]  # fmt: skip
    assert body["tool_choice"] == {"type": "function", "function": {"name": "calculator"}}
    assert body["max_tokens"] == 32 and "max_output_tokens" not in body
    assert body["response_format"]["json_schema"] == {"name": "n", "schema": {"type": "object"}}
    assert body["stream_options"] == {"include_usage": True}
    assert "store" not in body and "include" not in body


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": "x", "conversation": "c1"}, "conversation"),
        ({"input": "x", "background": True}, "background"),
        ({"input": [{"type": "function_call_output", "output": "5"}]}, "input[0]"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input[0][0]"),
    ],
)
def test_what_the_gateway_cannot_serve_is_refused_naming_the_field(
    payload: dict[str, Any], param: str
) -> None:
    with pytest.raises(ChatRequestError) as raised:
        chat_payload_of_response_request(payload)
    assert raised.value.param == param and raised.value.status_code == 400
