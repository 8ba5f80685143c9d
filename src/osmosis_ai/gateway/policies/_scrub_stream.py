"""Scrubbing a policy's credentials from a stream of chunks, also when a key is split.

An upstream streams text in small pieces, so an echoed key usually spans several chunks.
The end of each text piece that could begin a key is held back and sent with the next piece
(or when its choice finishes), so the caller never receives a key, whole or in parts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from osmosis_ai.redact import scrub_secrets
from osmosis_ai.rollout.scrub import scrub_json

__all__ = ["StreamScrubber"]

# (choice index, "content" | "reasoning_content" | tool-call index)
_Slot = tuple[int, str | int]
_TEXT_FIELDS = ("content", "reasoning_content")


def _possible_start(text: str, secrets: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of a secret."""
    longest = 0
    for secret in secrets:
        for length in range(min(len(secret) - 1, len(text)), longest, -1):
            if text.endswith(secret[:length]):
                longest = length
                break
    return longest


class StreamScrubber:
    """Scrubs ``secrets`` from successive ``chat.completion.chunk`` objects.

    Every field of a chunk is scrubbed; the text of ``delta.content``,
    ``delta.reasoning_content`` and tool-call ``arguments`` is also scrubbed across chunks.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = tuple(secret for secret in secrets if secret)
        self._held: dict[_Slot, str] = {}
        self._envelope: dict[str, Any] = {}

    def feed(self, chunk: dict[str, Any]) -> dict[str, Any]:
        """The chunk to send in place of ``chunk``."""
        if not self.secrets:
            return chunk
        chunk = scrub_json(chunk, self.secrets)
        self._envelope = {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict):
                self._pass(choice.get("index", 0), delta, final=bool(choice.get("finish_reason")))
        return chunk

    def flush(self) -> dict[str, Any] | None:
        """A last chunk carrying the text still held, if any (the stream ended)."""
        if not self._held:
            return None
        indexes = sorted({index for index, _ in self._held})
        choices = []
        for index in indexes:
            delta: dict[str, Any] = {}
            self._release(index, delta)
            choices.append({"index": index, "delta": delta, "finish_reason": None})
        return {**self._envelope, "choices": choices}

    def _pass(self, index: int, delta: dict[str, Any], *, final: bool) -> None:
        for field in _TEXT_FIELDS:
            if isinstance(delta.get(field), str):
                delta[field] = self._text((index, field), delta[field], final=final)
        for call in delta.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                slot = (index, int(call.get("index") or 0))
                function["arguments"] = self._text(slot, function["arguments"], final=final)
        if final:
            self._release(index, delta)

    def _text(self, slot: _Slot, text: str, *, final: bool) -> str:
        text = scrub_secrets(self._held.pop(slot, "") + text, secrets=self.secrets)
        keep = 0 if final else _possible_start(text, self.secrets)
        if keep:
            self._held[slot] = text[-keep:]
            return text[:-keep]
        return text

    def _release(self, index: int, delta: dict[str, Any]) -> None:
        # Text held for a choice that ends goes out with it.
        for slot in [slot for slot in self._held if slot[0] == index]:
            text = self._held.pop(slot)
            field = slot[1]
            if isinstance(field, str):
                delta[field] = text + (delta.get(field) or "")
            else:
                calls = delta.setdefault("tool_calls", [])
                calls.append({"index": field, "function": {"arguments": text}})
