"""Tool calling for a model whose chat template knows no tools (the instruction format).

The embedded model is told about the tools in its system message and generation is
constrained by a JSON schema built from the tool definitions, so every reply parses: either
``{"name": <tool>, "arguments": {...}}`` (a tool call) or ``{"answer": <text>}``. A model
whose template renders tools uses its own format instead (``tool_formats``).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Collection
from typing import Any

from osmosis_ai.gateway.policies.engines.base import JsonGrammar
from osmosis_ai.gateway.request import ChatRequest

__all__ = [
    "JSON_WHITESPACE",
    "Arguments",
    "ToolPlan",
    "call_options",
    "message_text",
    "plan_tools",
    "render_messages",
    "reply_message",
]

#: Most whitespace characters between two tokens of a JSON reply: the model may lay it out
#: as it likes (it was trained on indented JSON; a forced one-line layout pushes it off its
#: own tokens), bounded so that it cannot run on.
JSON_WHITESPACE = 12
#: Rewrites a tool's parameter schema (e.g. to bound its strings).
Arguments = Callable[[dict[str, Any]], dict[str, Any]]

_TOOLS = "You can call these tools:"
_CALL = 'To call a tool, reply with {"name": <tool name>, "arguments": <arguments object>}.'
_ANSWER_LINE = 'To answer directly, reply with {"answer": <your answer>}.'
_ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}


class ToolPlan:
    """How one request uses tools: the instruction to add and the schema to enforce.

    The schema admits calls of the ``callable`` tools only (default: all) and an answer only
    with ``allow_answer``. A ``stable`` instruction describes every tool of the request and
    both reply formats, whatever the turn may do: only the grammar changes, so the system
    message is the same text from call to call of a conversation and its history can be
    replayed exactly (``_history``). Otherwise it describes what the turn may do (the
    embedded policy's prompts, which the tiny model answers best).
    """

    def __init__(
        self,
        tools: list[dict[str, Any]],
        *,
        allow_answer: bool,
        callable: Collection[str] | None = None,
        stable: bool = False,
    ) -> None:
        self.tools = tools
        self.allow_answer = allow_answer
        self.callable = [
            tool for tool in tools if callable is None or tool["function"]["name"] in callable
        ]
        self.stable = stable

    def instruction(self) -> str:
        """System-message text describing the tools and the reply formats."""
        described = [
            {
                "name": tool["function"]["name"],
                "description": tool["function"].get("description", ""),
                "parameters": tool["function"].get("parameters") or {"type": "object"},
            }
            for tool in (self.tools if self.stable else self.callable)
        ]
        lines = [_TOOLS, json.dumps(described, ensure_ascii=False), _CALL]
        if self.stable or self.allow_answer:
            lines.append(_ANSWER_LINE)
        return "\n".join(lines)

    #: The template is not given the tools: the instruction describes them.
    template_tools = None

    def schema(self, arguments: Arguments | None = None) -> dict[str, Any]:
        """The JSON schema every reply must match (``arguments`` rewrites each tool's
        parameter schema)."""
        options = call_options(self.callable, arguments)
        if self.allow_answer:
            options.append(_ANSWER)
        return {"anyOf": options}

    def render(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages the template renders: plain text, the instruction in the system one."""
        return render_messages(messages, self)

    def grammar(self, arguments: Arguments | None = None) -> JsonGrammar:
        """The grammar of `schema`."""
        return JsonGrammar(json.dumps(self.schema(arguments)), max_whitespace=JSON_WHITESPACE)

    def reply(self, text: str) -> tuple[dict[str, Any], str | None]:
        """The assistant message of a reply (see `reply_message`)."""
        return reply_message(text)


def call_options(tools: list[dict[str, Any]], arguments: Arguments | None) -> list[dict[str, Any]]:
    """One JSON schema per tool for ``{"name": <its name>, "arguments": <its parameters>}``."""
    options = []
    for tool in tools:
        parameters = tool["function"].get("parameters") or {"type": "object"}
        options.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool["function"]["name"]},
                    "arguments": arguments(parameters) if arguments else parameters,
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return options


def plan_tools(
    request: ChatRequest, *, answer_after_tool_result: bool, stable: bool = False
) -> ToolPlan | None:
    """The tool plan for ``request`` (with a `stable` instruction or not), or ``None`` when it
    generates free text."""
    tools = request.tools
    choice = request.body.get("tool_choice")
    if not tools or choice == "none":
        return None
    if isinstance(choice, dict):
        named = {choice["function"]["name"]}
        return ToolPlan(tools, allow_answer=False, callable=named, stable=stable)
    if choice == "required":
        return ToolPlan(tools, allow_answer=False, stable=stable)
    if answer_after_tool_result and request.messages[-1].get("role") == "tool":
        # A tiny model asked again right after a tool result tends to repeat the call.
        return ToolPlan(tools, allow_answer=True, callable=(), stable=stable)
    return ToolPlan(tools, allow_answer=True, stable=stable)


def message_text(content: object) -> str:
    """A message's content as text: ``None`` is empty, text parts are joined by lines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text")
        ]
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)


def _call_text(call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = arguments
    return json.dumps({"name": function.get("name"), "arguments": parsed}, indent=4)


def render_messages(messages: list[dict[str, Any]], plan: ToolPlan | None) -> list[dict[str, Any]]:
    """Messages as plain role/content text the model's template can render."""
    rendered: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        content = message_text(message.get("content"))
        if role == "assistant" and message.get("tool_calls"):
            calls = "\n".join(_call_text(call) for call in message["tool_calls"])
            content = f"{content}\n{calls}".strip()
        if role == "developer":
            role = "system"
        rendered.append({"role": role, "content": content})
    if plan is not None:
        instruction = plan.instruction()
        if rendered and rendered[0]["role"] == "system":
            rendered[0] = {
                "role": "system",
                "content": f"{rendered[0]['content']}\n\n{instruction}",
            }
        else:
            rendered.insert(0, {"role": "system", "content": instruction})
    return rendered


def reply_message(text: str) -> tuple[dict[str, Any], str | None]:
    """The assistant message for a constrained reply, and ``"tool_calls"`` when it is one.

    A reply cut short (no valid JSON) keeps what it has: the answer text written so far when
    it was an answer, else the raw text.
    """
    try:
        reply = json.loads(text)
    except ValueError:
        partial = _partial_answer(text)
        return {"role": "assistant", "content": text if partial is None else partial}, None
    if isinstance(reply, dict) and isinstance(reply.get("name"), str):
        call = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {
                "name": reply["name"],
                "arguments": json.dumps(reply.get("arguments") or {}, ensure_ascii=False),
            },
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    if isinstance(reply, dict) and isinstance(reply.get("answer"), str):
        return {"role": "assistant", "content": reply["answer"]}, None
    return {"role": "assistant", "content": text}, None


_ANSWER_OPENING = re.compile(r'\s*\{\s*"answer"\s*:\s*"')
# Longest escape a cut can split: a \u escape, six characters.
_LONGEST_ESCAPE = 6


def _partial_answer(text: str) -> str | None:
    """The answer string of a cut-off ``{"answer": "...`` reply, or ``None`` if it is not one."""
    opening = _ANSWER_OPENING.match(text)
    if opening is None:
        return None
    rest = text[opening.end() :]
    for end in range(len(rest), max(len(rest) - _LONGEST_ESCAPE, 0) - 1, -1):
        try:
            decoded = json.loads(f'"{rest[:end]}"')
        except ValueError:
            continue
        return str(decoded)
    return None
