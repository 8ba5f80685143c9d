"""OpenAI's Responses API (``POST .../responses``) on the gateway's chat front.

Stateless: nothing is stored, so ``previous_response_id``, ``conversation`` and item
references are refused with one line (send the whole conversation as ``input``, as the OpenAI
Agents SDK does with a session). Input items map onto chat messages: messages, function calls
(joined to the assistant message they follow, as one chat reply carries both) and their
outputs; reasoning items carry nothing a chat template renders and are skipped. Function tools
only; hosted tools (web search, file search, computer use...) are refused.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

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

__all__ = ["ResponsesApi", "chat_payload_of_response_request"]

#: Fields with no chat counterpart that change nothing here (stored nowhere, no hosted
#: reasoning): accepted so that clients which always send them work.
_IGNORED = frozenset(
    {
        "store", "include", "metadata", "user", "truncation", "reasoning", "service_tier",
        "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "background",
        "stream_options", "top_logprobs", "max_tool_calls", "context_management",
    }
)  # fmt: skip
_STATEFUL = ("previous_response_id", "conversation", "prompt")
#: Fields the answer repeats from the request, as OpenAI's does.
_ECHOED = ("instructions", "max_output_tokens", "parallel_tool_calls", "temperature", "top_p")


def _text_of(content: object, where: str) -> str | list[dict[str, Any]]:
    """A message's content as chat content: a string, or parts when there is an image."""
    if isinstance(content, str):
        return content
    listed = a_list(content, f"{where} must be a string or a list of parts", where)
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(listed):
        at = f"{where}[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "refusal"):
            text = part.get("text", part.get("refusal"))
            expect(isinstance(text, str), f"{at}.text must be a string", at)
            parts.append({"type": "text", "text": text})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            expect(
                False,
                f"{at}: part type {kind!r} is not supported; send input_text, output_text or "
                "input_image (with an image_url)",
                at,
            )
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def _output_text(output: object, where: str) -> str:
    if isinstance(output, str):
        return output
    text = _text_of(output, where)
    expect(isinstance(text, str), f"{where}: a function call's output must be text", where)
    return text  # type: ignore[return-value]


def _messages(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = payload.get("instructions")
    if instructions is not None:
        expect(isinstance(instructions, str), "'instructions' must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    items = payload.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    listed = a_list(items, "'input' must be a string or a non-empty list of input items", "input")
    expect(bool(listed), "'input' must be a string or a non-empty list of input items", "input")
    for index, entry in enumerate(listed):
        at = f"input[{index}]"
        item = an_object(entry, f"{at} must be an object", at)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            expect(
                role in ("user", "assistant", "system", "developer"),
                f"{at}.role must be user, assistant, system or developer",
                f"{at}.role",
            )
            messages.append({"role": role, "content": _text_of(item.get("content"), at)})
        elif kind == "function_call":
            name, arguments = item.get("name"), item.get("arguments", "")
            expect(isinstance(name, str) and bool(name), f"{at}.name must be a string", at)
            expect(isinstance(arguments, str), f"{at}.arguments must be a JSON string", at)
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            last = messages[-1] if messages else None
            if (
                last is not None
                and last["role"] == "assistant"
                and isinstance(last.get("content") or "", str)
            ):
                last.setdefault("tool_calls", []).append(call)  # the same reply's call
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            expect(isinstance(call_id, str), f"{at}.call_id must be a string", at)
            content = _output_text(item.get("output"), f"{at}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        elif kind == "reasoning":
            continue  # our models' reasoning, if any, is in their text
        else:
            stored = kind == "item_reference"
            expect(
                False,
                f"{at}: input item type {kind!r} is not supported"
                + (
                    "; the gateway stores nothing: send the item itself"
                    if stored
                    else "; send messages, function_call and function_call_output items"
                ),
                f"{at}.type",
            )
    return messages


def _tools(tools: object) -> list[dict[str, Any]]:
    converted = []
    for index, tool in enumerate(
        a_list(tools, "'tools' must be a list of function tools", "tools")
    ):
        at = f"tools[{index}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        expect(
            kind == "function",
            f"{at}: tool type {kind!r} is not supported; the gateway serves function tools "
            "(hosted tools run at OpenAI)",
            f"{at}.type",
        )
        function = {"name": tool.get("name"), "parameters": tool.get("parameters") or {}}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        converted.append({"type": "function", "function": function})
    return converted


def _tool_choice(choice: object) -> object:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    expect(
        isinstance(choice, str),
        "'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
        "tool_choice",
    )
    return choice


def _response_format(text: object) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    expect(
        fmt.get("type") == "json_schema",
        "'text.format.type' must be text, json_object or json_schema",
        "text.format",
    )
    schema = {key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}
    return {"type": "json_schema", "json_schema": schema}


def chat_payload_of_response_request(payload: object) -> dict[str, Any]:
    """A Responses request body as the chat-completions body the policy answers.

    Raises:
        ChatRequestError: The body is no Responses request, or asks for state or hosted
            tools (the message names the field).
    """
    payload = an_object(payload, "the request body must be a JSON object", "body")
    for name in _STATEFUL:
        expect(
            payload.get(name) is None,
            f"'{name}' is not supported: the gateway stores no responses; send the whole "
            "conversation as 'input'",
            name,
        )
    expect(
        not payload.get("background"),
        "'background' is not supported: the gateway answers while the request waits",
        "background",
    )
    body: dict[str, Any] = {"messages": _messages(payload)}
    for name, value in payload.items():
        if name in ("input", "instructions", "text", *_IGNORED):
            continue
        if name == "tools":
            body["tools"] = _tools(value)
        elif name == "tool_choice":
            body["tool_choice"] = _tool_choice(value)
        elif name == "max_output_tokens":
            body["max_tokens"] = value
        elif name == "parallel_tool_calls":
            body[name] = value
        else:
            body[forwarded(name, "Responses")] = value
    if (response_format := _response_format(payload.get("text"))) is not None:
        body["response_format"] = response_format
    return completed_chat_body(body)


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [_text_part(text)] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": content}  # fmt: skip


def _call_item(call: Mapping[str, Any], status: str = "completed") -> dict[str, Any]:
    function = call.get("function") or {}
    return {
        "type": "function_call",
        "id": _new_id("fc"),
        "call_id": call.get("id") or _new_id("call"),
        "name": function.get("name", ""),
        "arguments": function.get("arguments") or "{}",
        "status": status,
    }


class _ResponseCall(ApiCall):
    def __init__(self, chat: ChatRequest, payload: Mapping[str, Any]) -> None:
        self.chat = chat
        self.id = _new_id("resp")
        self.created_at = int(time.time())
        self._echo = {name: payload.get(name) for name in _ECHOED}
        self._echo["tools"] = payload.get("tools") or []
        self._echo["tool_choice"] = payload.get("tool_choice", "auto")
        self._echo["text"] = payload.get("text") or {"format": {"type": "text"}}
        self._model = chat.requested_model or ""
        # Streaming state.
        self._sequence = 0
        self._replies = ReplyAccumulator()
        self._message_id: str | None = None
        self._items: list[dict[str, Any]] = []

    def _response(
        self, status: str, output: list[dict[str, Any]], reply: ChatReply | None
    ) -> dict[str, Any]:
        incomplete = status == "incomplete"
        usage = None
        if reply is not None:
            usage = {
                "input_tokens": reply.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": reply.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            }
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": self._model,
            "output": output,
            "previous_response_id": None,
            "reasoning": None,
            "store": False,
            "truncation": "disabled",
            "metadata": {},
            "usage": usage,
            **self._echo,
        }

    def _output(self, reply: ChatReply, message_id: str | None) -> list[dict[str, Any]]:
        output = []
        if reply.text or not reply.tool_calls:
            output.append(_message_item(message_id or _new_id("msg"), reply.text, "completed"))
        output.extend(_call_item(call) for call in reply.tool_calls)
        return output

    @staticmethod
    def _status(reply: ChatReply) -> str:
        return "incomplete" if reply.finish_reason == "length" else "completed"

    def answer(self, completion: dict[str, Any]) -> dict[str, Any]:
        reply = reply_of_completion(completion)
        self._model = completion.get("model") or self._model
        return self._response(self._status(reply), self._output(reply, None), reply)

    def _event(self, kind: str, **fields: Any) -> bytes:
        self._sequence += 1
        return sse_event({"type": kind, "sequence_number": self._sequence, **fields}, kind)

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        events = []
        if self._sequence == 0:
            self._model = chunk.get("model") or self._model
            created = self._response("in_progress", [], None)
            events += [
                self._event("response.created", response=created),
                self._event("response.in_progress", response=created),
            ]
        delta = self._replies.feed(chunk)
        if not delta:
            return events
        if self._message_id is None:
            self._message_id = _new_id("msg")
            item = _message_item(self._message_id, "", "in_progress")
            events += [
                self._event("response.output_item.added", output_index=0, item=item),
                self._event("response.content_part.added", item_id=self._message_id,
                            output_index=0, content_index=0, part=_text_part("")),
            ]  # fmt: skip
        events.append(
            self._event("response.output_text.delta", item_id=self._message_id, output_index=0,
                        content_index=0, delta=delta, logprobs=[])
        )  # fmt: skip
        return events

    def end(self, data: CallData) -> list[bytes]:
        reply = self._replies.finished(data)
        output = self._output(reply, self._message_id)
        events = self.feed({}) if self._sequence == 0 else []
        for index, item in enumerate(output):
            if item["type"] == "message":
                events += self._message_events(index, item, reply.text)
            else:
                events += self._call_events(index, item)
        kind = "response." + self._status(reply)
        events.append(
            self._event(kind, response=self._response(self._status(reply), output, reply))
        )
        return events

    def _message_events(self, index: int, item: dict[str, Any], text: str) -> list[bytes]:
        events = []
        if self._message_id is None:  # no text was streamed: open the item now
            opened = _message_item(item["id"], "", "in_progress")
            events += [
                self._event("response.output_item.added", output_index=index, item=opened),
                self._event("response.content_part.added", item_id=item["id"],
                            output_index=index, content_index=0, part=_text_part("")),
            ]  # fmt: skip
        return events + [
            self._event("response.output_text.done", item_id=item["id"], output_index=index,
                        content_index=0, text=text, logprobs=[]),
            self._event("response.content_part.done", item_id=item["id"], output_index=index,
                        content_index=0, part=_text_part(text)),
            self._event("response.output_item.done", output_index=index, item=item),
        ]  # fmt: skip

    def _call_events(self, index: int, item: dict[str, Any]) -> list[bytes]:
        opened = {**item, "arguments": "", "status": "in_progress"}
        return [
            self._event("response.output_item.added", output_index=index, item=opened),
            self._event("response.function_call_arguments.delta", item_id=item["id"],
                        output_index=index, delta=item["arguments"]),
            self._event("response.function_call_arguments.done", item_id=item["id"],
                        output_index=index, name=item["name"], arguments=item["arguments"]),
            self._event("response.output_item.done", output_index=index, item=item),
        ]  # fmt: skip

    def fail(self, message: str, error_type: str) -> list[bytes]:
        failed = self._response("failed", [], None)
        failed["error"] = {"code": error_type, "message": message}
        return [
            self._event("error", code=error_type, message=message, param=None),
            self._event("response.failed", response=failed),
        ]


class ResponsesApi(Api):
    """``POST /v1/rollouts/{rollout_id}/responses``: OpenAI's Responses API."""

    path = "responses"

    def parse(self, payload: object, *, sampling: Mapping[str, Any], rollout_id: str) -> ApiCall:
        body = chat_payload_of_response_request(payload)
        chat = parse_chat_request(body, sampling=sampling, rollout_id=rollout_id)
        return _ResponseCall(chat, an_object(payload, "", "body"))
