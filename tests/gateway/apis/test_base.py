"""What the translated APIs share: a streamed reply gathered from chat chunks, the fields
forwarded as they are, and the stream events each API writes for the same chunks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from osmosis_ai.errors import ChatRequestError
from osmosis_ai.gateway.apis import MessagesApi, ResponsesApi
from osmosis_ai.gateway.apis.base import ReplyAccumulator, forwarded
from osmosis_ai.gateway.calls import CallData, StreamAccumulator
from osmosis_ai.gateway.policies.base import chunks_of


def _chunk(delta: dict[str, Any], finish: str | None = None, **envelope: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **envelope}


#: A reply streamed as text, then a tool call in fragments, then usage.
CHUNKS = [
    _chunk({"role": "assistant", "content": "Let me "}, model="m", prompt_token_ids=[1, 2, 3]),
    _chunk({"content": "add."}),
    _chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "add", "arguments": '{"a": '}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "2}"}}]}, "tool_calls"),
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}},
]  # fmt: skip


def test_a_streamed_reply_is_gathered_whole() -> None:
    replies = ReplyAccumulator()
    assert [replies.feed(chunk) for chunk in CHUNKS] == ["Let me ", "add.", "", "", ""]
    reply = replies.finished(CallData())
    assert reply.text == "Let me add." and reply.finish_reason == "tool_calls"
    assert reply.tool_calls == [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}
    ]
    assert (reply.prompt_tokens, reply.completion_tokens) == (3, 9)


def test_token_counts_come_from_the_record_when_the_stream_has_no_usage() -> None:
    replies = ReplyAccumulator()
    replies.feed(CHUNKS[0])
    reply = replies.finished(CallData(prompt_token_ids=[1, 2], completion_token_ids=[5, 6, 7]))
    assert (reply.prompt_tokens, reply.completion_tokens) == (2, 3)


def test_sampling_fields_are_forwarded_and_anything_else_is_refused() -> None:
    assert forwarded("top_k", "Messages") == "top_k"
    with pytest.raises(ChatRequestError) as refused:
        forwarded("api_base", "Messages")
    assert refused.value.param == "api_base" and "Messages API" in str(refused.value)


def _events(stream: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each server-sent event."""
    parsed = []
    for event in stream:
        head, data = event.decode().strip().split("\n")
        parsed.append((head.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return parsed


def _streamed(call: Any, chunks: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    record = StreamAccumulator()
    events = []
    for chunk in chunks:
        record.feed(chunk)
        events += call.feed(chunk)
    return _events(events + call.end(record.data))


def _call(api: Any, **body: Any) -> Any:
    return api.parse(body, sampling={}, rollout_id="r")


def test_responses_stream_text_as_it_comes_then_the_call_then_the_whole_response() -> None:
    call = _call(ResponsesApi(), model="m", input="2+2?", stream=True)
    events = _streamed(call, CHUNKS)
    kinds = [kind for kind, _ in events]
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert [data["sequence_number"] for _, data in events] == list(range(1, len(events) + 1))
    assert all(data["type"] == kind for kind, data in events)
    final = events[-1][1]["response"]
    message, function_call = final["output"]
    assert message["content"][0]["text"] == "Let me add."
    assert (function_call["call_id"], function_call["arguments"]) == ("call_1", '{"a": 2}')
    assert final["usage"]["input_tokens"] == 3 and final["usage"]["output_tokens"] == 9
    # The streamed text item and the final response's message are the same item.
    assert events[2][1]["item"]["id"] == message["id"]


def test_messages_stream_text_as_it_comes_then_the_tool_use() -> None:
    call = _call(MessagesApi(), model="m", max_tokens=8, stream=True,
                 messages=[{"role": "user", "content": "2+2?"}])  # fmt: skip
    events = _streamed(call, CHUNKS)
    assert [kind for kind, _ in events] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "content_block_start", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert events[0][1]["message"]["usage"]["input_tokens"] == 3
    assert events[5][1]["content_block"]["type"] == "tool_use"
    assert json.loads(events[6][1]["delta"]["partial_json"]) == {"a": 2}
    assert events[8][1]["delta"]["stop_reason"] == "tool_use"
    assert events[8][1]["usage"]["output_tokens"] == 9


@pytest.mark.parametrize("api", [ResponsesApi(), MessagesApi()])
def test_a_whole_answer_streams_as_the_same_events(api: Any) -> None:
    """Engines answer a call at once: its chunks (``chunks_of``) stream the same reply."""
    completion = {
        "id": "c", "model": "m", "prompt_token_ids": [1],
        "choices": [{"index": 0, "finish_reason": "length",
                     "message": {"role": "assistant", "content": "cut sho"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
    }  # fmt: skip
    body = {"model": "m", "stream": True, "max_tokens": 3}
    body |= {"input": "x"} if isinstance(api, ResponsesApi) else {
        "messages": [{"role": "user", "content": "x"}]}  # fmt: skip
    streamed = _streamed(_call(api, **body), chunks_of(completion))
    whole = _call(api, **{**body, "stream": False}).answer(completion)
    if isinstance(api, ResponsesApi):
        final = streamed[-1][1]["response"]
        assert streamed[-1][0] == "response.incomplete" and final["status"] == "incomplete"
        assert final["incomplete_details"] == whole["incomplete_details"]
        assert final["output"][0]["content"] == whole["output"][0]["content"]
    else:
        assert streamed[-2][1]["delta"]["stop_reason"] == whole["stop_reason"] == "max_tokens"
        text = "".join(
            d["delta"].get("text", "") for k, d in streamed if k == "content_block_delta"
        )
        assert text == whole["content"][0]["text"] == "cut sho"


@pytest.mark.parametrize("api", [ResponsesApi(), MessagesApi()])
def test_a_failed_stream_ends_with_an_error_event(api: Any) -> None:
    body = {"model": "m", "stream": True, "max_tokens": 3}
    body |= {"input": "x"} if isinstance(api, ResponsesApi) else {
        "messages": [{"role": "user", "content": "x"}]}  # fmt: skip
    call = _call(api, **body)
    events = _events(call.feed(CHUNKS[0]) + call.fail("upstream down", "upstream_error"))
    errors = [data for kind, data in events if kind == "error"]
    assert len(errors) == 1 and "upstream down" in json.dumps(errors[0])
    if isinstance(api, ResponsesApi):
        assert events[-1][0] == "response.failed"
