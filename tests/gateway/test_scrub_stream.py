"""Scrubbing a policy's key from streamed chunks, also when the key spans several chunks."""

from __future__ import annotations

from typing import Any

import pytest

from osmosis_ai.gateway.policies._scrub_stream import StreamScrubber

KEY = "sk-stream-5e1f0c2a9b"
ENVELOPE = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def _chunk(finish: str | None = None, **delta: Any) -> dict[str, Any]:
    return {**ENVELOPE, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _text(chunks: list[dict[str, Any]], field: str = "content") -> str:
    return "".join(c["choices"][0]["delta"].get(field) or "" for c in chunks if c["choices"])


@pytest.mark.parametrize("size", [1, 3, 7, len(KEY)])
def test_a_key_split_across_chunks_never_goes_out(size: int) -> None:
    text = f"the key is {KEY}, and {KEY}"
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    scrubber = StreamScrubber([KEY])
    out = [scrubber.feed(_chunk(content=piece)) for piece in pieces]
    out.append(scrubber.feed(_chunk("stop")))
    assert scrubber.flush() is None
    sent = [c["choices"][0]["delta"].get("content") or "" for c in out]
    assert not any(KEY[:4] in piece for piece in sent if piece != "[REDACTED]")
    assert _text(out) == "the key is [REDACTED], and [REDACTED]"


def test_tool_call_arguments_are_scrubbed_across_chunks() -> None:
    scrubber = StreamScrubber([KEY])
    first = {"index": 0, "id": "t", "type": "function", "function": {"name": "f", "arguments": ""}}
    out = [scrubber.feed(_chunk(tool_calls=[first]))]
    for piece in ('{"k": "', KEY[:5], KEY[5:], '"}'):
        out.append(
            scrubber.feed(_chunk(tool_calls=[{"index": 0, "function": {"arguments": piece}}]))
        )
    out.append(scrubber.feed(_chunk("tool_calls")))
    arguments = "".join(
        call["function"].get("arguments") or ""
        for c in out
        for call in c["choices"][0]["delta"].get("tool_calls") or []
    )
    assert arguments == '{"k": "[REDACTED]"}'


def test_text_held_when_the_stream_ends_is_flushed() -> None:
    scrubber = StreamScrubber([KEY])
    out = [scrubber.feed(_chunk(content="almost sk-str"))]
    assert _text(out) == "almost "
    rest = scrubber.flush()
    assert rest is not None and rest["id"] == "c"
    assert _text([rest]) == "sk-str"  # not the key, so it is sent as it was


def test_without_secrets_chunks_pass_unchanged() -> None:
    chunk = _chunk(content="s")
    assert StreamScrubber([]).feed(chunk) is chunk
