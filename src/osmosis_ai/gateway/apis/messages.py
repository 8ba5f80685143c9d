"""Anthropic's Messages API (``POST .../messages``) on the gateway's chat front.

The ``anthropic`` client given a rollout's endpoint as ``base_url`` posts to
``<base_url>/v1/messages`` and sends its key as ``x-api-key``; both that path and
``.../messages`` are served, and the key is taken from either header. Content blocks map onto
chat messages: text, images (as data or URL images), ``tool_use`` (the assistant's tool calls)
and ``tool_result`` (a tool message each, before the rest of their user turn); system turns
stay system messages; thinking blocks carry nothing a chat template renders and are skipped.
Custom (function) tools only; server tools (web search, code execution...) are refused;
``output_config.format`` (structured output) is held by the same JSON grammar as chat
completions' ``response_format``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from osmosis_ai.errors import GatewayError
from osmosis_ai.gateway.apis.base import (
    Api,
    ApiCall,
    ChatReply,
    ReplyAccumulator,
    a_list,
    an_object,
    completed_chat_body,
    expect,
    forwarded,
    reply_of_completion,
    sse_event,
)
from osmosis_ai.gateway.calls import CallData
from osmosis_ai.gateway.request import ChatRequest, parse_chat_request

__all__ = ["MessagesApi", "chat_payload_of_messages_request"]

#: Fields with no chat counterpart that change nothing here.
_IGNORED = frozenset(
    {
        "metadata", "service_tier", "thinking", "container", "mcp_servers", "cache_control",
        "diagnostics", "inference_geo", "speed", "user_profile_id", "workspace_id",
        "context_management",
    }
)  # fmt: skip
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
#: Anthropic's error type for each status the gateway answers with.
_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
    422: "invalid_request_error", 429: "rate_limit_error", 503: "overloaded_error",
}  # fmt: skip


def _text(blocks: list[Any], where: str) -> str | list[dict[str, Any]]:
    """Text and image blocks as chat content (a string unless there is an image)."""
    parts: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        at = f"{where}[{index}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            expect(isinstance(block.get("text"), str), f"{at}.text must be a string", at)
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, at)}})
        else:
            expect(False, f"{at}: block type {kind!r} is not supported here", f"{at}.type")
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def _image_url(block: dict[str, Any], at: str) -> str:
    source = block.get("source") or {}
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    expect(
        source.get("type") == "base64" and isinstance(source.get("data"), str),
        f"{at}.source must be a base64 or url image source",
        f"{at}.source",
    )
    return f"data:{source.get('media_type', 'image/png')};base64,{source['data']}"


def _blocks(content: object, at: str) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    expect(isinstance(content, list), f"{at} must be a string or a list of blocks", at)
    return content  # type: ignore[return-value]


def _user_turn(content: object, at: str) -> list[dict[str, Any]]:
    """A user message: its tool results as tool messages, then the rest as one user message."""
    messages: list[dict[str, Any]] = []
    rest: list[Any] = []
    for index, block in enumerate(_blocks(content, at)):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            where = f"{at}[{index}]"
            call_id = block.get("tool_use_id")
            expect(isinstance(call_id, str), f"{where}.tool_use_id must be a string", where)
            result = _text(_blocks(block.get("content") or "", f"{where}.content"), where)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        else:
            rest.append(block)
    if rest or not messages:
        messages.append({"role": "user", "content": _text(rest, at)})
    return messages


def _assistant_turn(content: object, at: str) -> dict[str, Any]:
    """An assistant message: its text, and its ``tool_use`` blocks as tool calls."""
    text: list[Any] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(_blocks(content, at)):
        kind = block.get("type") if isinstance(block, dict) else None
        where = f"{at}[{index}]"
        if kind == "tool_use":
            expect(isinstance(block.get("name"), str), f"{where}.name must be a string", where)
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block["name"], "arguments": arguments}})  # fmt: skip
        elif kind in ("thinking", "redacted_thinking"):
            continue  # our models' reasoning, if any, is in their text
        else:
            text.append(block)
    message: dict[str, Any] = {"role": "assistant", "content": _text(text, at) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: object) -> list[dict[str, Any]]:
    converted = []
    for index, entry in enumerate(a_list(tools, "'tools' must be a list of tools", "tools")):
        at = f"tools[{index}]"
        tool = an_object(entry, f"{at} must be an object", at)
        expect(
            tool.get("type", "custom") == "custom" and "input_schema" in tool,
            f"{at}: only custom tools (name, description, input_schema) are served; server "
            f"tools such as {tool.get('type')!r} run at Anthropic",
            f"{at}.type",
        )
        function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        converted.append({"type": "function", "function": function})
    return converted


def _tool_choice(choice: object) -> object:
    message = (
        "'tool_choice' must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}"
    )
    chosen = an_object(choice, message, "tool_choice")
    if chosen.get("type") == "tool":
        return {"type": "function", "function": {"name": chosen.get("name")}}
    modes = {"auto": "auto", "any": "required", "none": "none"}
    expect(chosen.get("type") in modes, message, "tool_choice")
    return modes[chosen["type"]]


def _response_format(config: object) -> dict[str, Any] | None:
    """``output_config.format`` (structured output) as a chat ``response_format``; its
    ``effort`` changes nothing here."""
    chosen = an_object(config, "'output_config' must be an object", "output_config")
    fmt = chosen.get("format")
    if fmt is None:
        return None
    expect(
        isinstance(fmt, dict) and fmt.get("type") == "json_schema",
        "'output_config.format' must be {'type': 'json_schema', 'schema': {...}}",
        "output_config.format",
    )
    return {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": fmt.get("schema") or {}},
    }


def chat_payload_of_messages_request(payload: object) -> dict[str, Any]:
    """A Messages request body as the chat-completions body the policy answers.

    Raises:
        ChatRequestError: The body is no Messages request, or asks for server tools (the
            message names the field).
    """
    payload = an_object(payload, "the request body must be a JSON object", "body")
    expect(
        payload.get("max_tokens") is not None,
        "'max_tokens' is required: the most tokens the reply may have",
        "max_tokens",
    )
    turns = a_list(payload.get("messages"), "'messages' must be a non-empty list", "messages")
    expect(bool(turns), "'messages' must be a non-empty list", "messages")
    messages: list[dict[str, Any]] = []
    system = payload.get("system")
    if system is not None:
        messages.append({"role": "system", "content": _text(_blocks(system, "system"), "system")})
    for index, entry in enumerate(turns):
        at = f"messages[{index}]"
        turn = an_object(entry, f"{at} must be an object", at)
        role = turn.get("role")
        expect(
            role in ("user", "assistant", "system"),
            f"{at}.role must be user, assistant or system",
            at,
        )
        content = turn.get("content")
        if role == "user":
            messages.extend(_user_turn(content, f"{at}.content"))
        elif role == "assistant":
            messages.append(_assistant_turn(content, f"{at}.content"))
        else:  # instructions within the conversation
            text = _text(_blocks(content, f"{at}.content"), f"{at}.content")
            messages.append({"role": "system", "content": text})
    body: dict[str, Any] = {"messages": messages}
    for name, value in payload.items():
        if name in ("messages", "system", *_IGNORED):
            continue
        if name == "tools":
            body["tools"] = _tools(value)
        elif name == "tool_choice":
            body["tool_choice"] = _tool_choice(value)
        elif name == "stop_sequences":
            body["stop"] = value
        elif name == "output_config":
            if (response_format := _response_format(value)) is not None:
                body["response_format"] = response_format
        else:  # model, max_tokens, stream; sampling (in extra_body: anthropic>=2 has none)
            body[forwarded(name, "Messages")] = value
    return completed_chat_body(body)


def _blocks_of(reply: ChatReply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.text or not reply.tool_calls:
        blocks.append({"type": "text", "text": reply.text})
    for call in reply.tool_calls:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        blocks.append({
            "type": "tool_use",
            "id": call.get("id") or f"toolu_{uuid.uuid4().hex}",
            "name": function.get("name", ""),
            "input": arguments if isinstance(arguments, dict) else {},
        })  # fmt: skip
    return blocks


class _MessageCall(ApiCall):
    def __init__(self, chat: ChatRequest) -> None:
        self.chat = chat
        self.id = f"msg_{uuid.uuid4().hex}"
        self._model = chat.requested_model or ""
        self._replies = ReplyAccumulator()
        self._started = False
        self._text_open = False

    def _message(self, reply: ChatReply, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": content,
            "stop_reason": _STOP_REASONS.get(reply.finish_reason or ""),
            "stop_sequence": None,
            "usage": {
                "input_tokens": reply.prompt_tokens,
                "output_tokens": reply.completion_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }

    def answer(self, completion: dict[str, Any]) -> dict[str, Any]:
        reply = reply_of_completion(completion)
        self._model = completion.get("model") or self._model
        return self._message(reply, _blocks_of(reply))

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        events = []
        if not self._started:
            self._started = True
            self._model = chunk.get("model") or self._model
            prompt = chunk.get("prompt_token_ids")
            opening = ChatReply(prompt_tokens=len(prompt) if isinstance(prompt, list) else 0)
            events.append(_event("message_start", message=self._message(opening, [])))
        delta = self._replies.feed(chunk)
        if delta:
            if not self._text_open:
                self._text_open = True
                events.append(_event("content_block_start", index=0,
                                     content_block={"type": "text", "text": ""}))  # fmt: skip
            events.append(_event("content_block_delta", index=0,
                                 delta={"type": "text_delta", "text": delta}))  # fmt: skip
        return events

    def end(self, data: CallData) -> list[bytes]:
        events = self.feed({}) if not self._started else []
        reply = self._replies.finished(data)
        blocks = _blocks_of(reply)
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                if not self._text_open:
                    events.append(_event("content_block_start", index=index,
                                         content_block={"type": "text", "text": ""}))  # fmt: skip
            else:
                opened = {**block, "input": {}}
                partial = json.dumps(block["input"], ensure_ascii=False)
                events += [
                    _event("content_block_start", index=index, content_block=opened),
                    _event("content_block_delta", index=index,
                           delta={"type": "input_json_delta", "partial_json": partial}),
                ]  # fmt: skip
            events.append(_event("content_block_stop", index=index))
        message = self._message(reply, blocks)
        events += [
            _event("message_delta",
                   delta={"stop_reason": message["stop_reason"], "stop_sequence": None},
                   usage={"input_tokens": reply.prompt_tokens,
                          "output_tokens": reply.completion_tokens}),
            _event("message_stop"),
        ]  # fmt: skip
        return events

    def fail(self, message: str, error_type: str) -> list[bytes]:
        return [_event("error", error={"type": "api_error", "message": message})]


def _event(kind: str, **fields: Any) -> bytes:
    return sse_event({"type": kind, **fields}, kind)


class MessagesApi(Api):
    """``POST /v1/rollouts/{rollout_id}/v1/messages`` (and ``.../messages``): Anthropic's
    Messages API."""

    path = "messages"

    def credential(self, headers: Mapping[bytes, str]) -> str:
        """``Authorization``, or the ``x-api-key`` the ``anthropic`` client sends."""
        key = headers.get(b"x-api-key")
        return f"Bearer {key}" if key else headers.get(b"authorization", "")

    def parse(self, payload: object, *, sampling: Mapping[str, Any], rollout_id: str) -> ApiCall:
        body = chat_payload_of_messages_request(payload)
        return _MessageCall(parse_chat_request(body, sampling=sampling, rollout_id=rollout_id))

    def error_body(self, message: str, error: GatewayError) -> dict[str, Any]:
        """Anthropic's error shape, ``{"type": "error", "error": {"type", "message"}}``, with
        Anthropic's type for the status."""
        kind = _ERROR_TYPES.get(error.status_code, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
