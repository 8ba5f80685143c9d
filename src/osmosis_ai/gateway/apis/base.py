"""What every API the gateway speaks shares: a call translated onto chat completions.

The policies behind the gateway answer one API, chat completions. Every other API a rollout
may speak (OpenAI's Responses, Anthropic's Messages) is translated at the edge: its request
becomes a `ChatRequest`, the policy answers it as for any chat call (so the same tool formats,
exact history and token records apply), and the answer or its stream is expressed back in the
caller's API. The translation is pure; the gateway's handler does the I/O.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from osmosis_ai.errors import ChatRequestError, GatewayError
from osmosis_ai.gateway.calls import CallData
from osmosis_ai.gateway.request import SAMPLING_FIELDS, ChatRequest

__all__ = [
    "FORWARDED",
    "Api",
    "forwarded",
    "a_list",
    "an_object",
    "completed_chat_body",
    "ApiCall",
    "ChatReply",
    "ReplyAccumulator",
    "openai_error_body",
    "expect",
    "reply_of_completion",
    "sse_event",
]


def openai_error_body(message: str, error_type: str, param: str | None = None) -> dict[str, Any]:
    """An error in OpenAI's shape (chat completions, Responses, the gateway's own routes)."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": None}}


def sse_event(data: Mapping[str, Any], event: str | None = None) -> bytes:
    """One server-sent event: an optional ``event:`` line and the JSON ``data:`` line."""
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + body + b"\n\n"


@dataclass(slots=True)
class ChatReply:
    """An assistant reply as the policy gave it: text, tool calls, why it ended, usage."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """OpenAI tool calls: ``{"id", "type": "function", "function": {"name", "arguments"}}``."""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


def reply_of_completion(completion: Mapping[str, Any]) -> ChatReply:
    """The reply of a non-streamed ``chat.completion``."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    reply = ChatReply(
        text=message.get("content") or "",
        tool_calls=[dict(call) for call in message.get("tool_calls") or ()],
        finish_reason=choice.get("finish_reason"),
    )
    _take_usage(reply, completion.get("usage"))
    return reply


def _take_usage(reply: ChatReply, usage: object) -> None:
    if isinstance(usage, dict):
        reply.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        reply.completion_tokens = int(usage.get("completion_tokens") or 0)


class ReplyAccumulator:
    """Gathers a streamed reply chunk by chunk: text deltas, tool-call fragments by index."""

    def __init__(self) -> None:
        self.reply = ChatReply()
        self._calls: dict[int, dict[str, Any]] = {}

    def feed(self, chunk: Mapping[str, Any]) -> str:
        """Read one ``chat.completion.chunk``; returns its new text (possibly empty)."""
        _take_usage(self.reply, chunk.get("usage"))
        text = ""
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.reply.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or {}
            text += delta.get("content") or ""
            for fragment in delta.get("tool_calls") or ():
                self._add_fragment(fragment)
        self.reply.text += text
        return text

    def _add_fragment(self, fragment: dict[str, Any]) -> None:
        index = fragment.get("index", len(self._calls))
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = {"id": None, "type": "function", "function": {}}
            self.reply.tool_calls.append(call)
        function = fragment.get("function") or {}
        if fragment.get("id"):
            call["id"] = fragment["id"]
        target = call["function"]
        if function.get("name"):
            target["name"] = target.get("name", "") + function["name"]
        if function.get("arguments"):
            target["arguments"] = target.get("arguments", "") + function["arguments"]

    def finished(self, data: CallData) -> ChatReply:
        """The whole reply, its token counts taken from the call's record when the stream
        carried no usage."""
        reply = self.reply
        if not reply.prompt_tokens and data.prompt_token_ids is not None:
            reply.prompt_tokens = len(data.prompt_token_ids)
        if not reply.completion_tokens:
            reply.completion_tokens = len(data.completion_token_ids)
        return reply


class ApiCall(ABC):
    """One call in some API, translated: the chat request the policy answers, and the way
    back to the caller's API."""

    chat: ChatRequest

    @abstractmethod
    def answer(self, completion: dict[str, Any]) -> dict[str, Any]:
        """The caller's answer, from the policy's ``chat.completion``."""

    @abstractmethod
    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        """The events to send for one of the policy's ``chat.completion.chunk`` objects."""

    @abstractmethod
    def end(self, data: CallData) -> list[bytes]:
        """The events that close a stream that ended well (``data``: the call's record)."""

    @abstractmethod
    def fail(self, message: str, error_type: str) -> list[bytes]:
        """The events that close a stream the policy failed in."""


class Api(ABC):
    """An API the gateway speaks on a rollout's endpoint."""

    #: The route under ``/v1/rollouts/{rollout_id}/``.
    path: str

    def credential(self, headers: Mapping[bytes, str]) -> str:
        """The ``Authorization`` value the caller presented (``Bearer <token>``)."""
        return headers.get(b"authorization", "")

    @abstractmethod
    def parse(self, payload: object, *, sampling: Mapping[str, Any], rollout_id: str) -> ApiCall:
        """Translate a decoded request body.

        Raises:
            ChatRequestError: The body is not a valid request of this API, or asks for
                something the gateway does not serve (the message names the field).
        """

    def error_body(self, message: str, error: GatewayError) -> dict[str, Any]:
        """The answer to ``error`` (its redacted ``message``) in this API's shape."""
        return openai_error_body(message, error.error_type, error.param)


def expect(condition: bool, message: str, param: str) -> None:
    """Refuse a request field with one line (400) unless ``condition`` holds."""
    if not condition:
        raise ChatRequestError(message, param=param)


#: Fields every translated API passes to the chat request as they are: the model, streaming,
#: and the sampling fields a gateway may impose (vLLM's extras among them, which clients send
#: in ``extra_body``), the token data the gateway can return.
FORWARDED = SAMPLING_FIELDS | {"model", "stream", "logprobs", "return_token_ids"}


def forwarded(name: str, api: str) -> str:
    """``name``, a field forwarded as it is (`FORWARDED`); else the refusal (one line, 400).

    Raises:
        ChatRequestError: A field the gateway neither translates nor forwards.
    """
    if name not in FORWARDED:
        raise ChatRequestError(
            f"field {name!r} is not supported by the gateway's {api} API; remove it "
            f"(besides the API's own fields it takes {', '.join(sorted(SAMPLING_FIELDS))})",
            param=name,
        )
    return name


def completed_chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """A translated chat body made whole: no ``tool_choice`` without tools (an empty tool
    list is none), and a stream asks for its usage chunk (the caller's API reports usage)."""
    if not body.get("tools"):
        body.pop("tools", None)
        body.pop("tool_choice", None)
    if body.get("stream"):
        body["stream_options"] = {"include_usage": True}
    return body


def a_list(value: object, message: str, param: str) -> list[Any]:
    """``value``, which must be a list (else `expect`'s refusal)."""
    if not isinstance(value, list):
        raise ChatRequestError(message, param=param)
    return value


def an_object(value: object, message: str, param: str) -> dict[str, Any]:
    """``value``, which must be a JSON object (else `expect`'s refusal)."""
    if not isinstance(value, dict):
        raise ChatRequestError(message, param=param)
    return value
