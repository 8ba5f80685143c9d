"""Tool calling for a model whose chat template knows no tools.

The embedded model is told about the tools in its system message and generation is
constrained by a JSON schema built from the tool definitions, so every reply parses: either
``{"name": <tool>, "arguments": {...}}`` (a tool call) or ``{"answer": <text>}``.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from osmosis_ai.gateway.request import ChatRequest

__all__ = ["ToolPlan", "plan_tools", "render_messages", "reply_message"]

_ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}


class ToolPlan:
    """How one request uses tools: the instruction to add and the schema to enforce."""

    def __init__(self, tools: list[dict[str, Any]], *, allow_answer: bool) -> None:
        self.tools = tools
        self.allow_answer = allow_answer

    def instruction(self) -> str:
        """System-message text describing the tools and the reply format."""
        described = [
            {
                "name": tool["function"]["name"],
                "description": tool["function"].get("description", ""),
                "parameters": tool["function"].get("parameters") or {"type": "object"},
            }
            for tool in self.tools
        ]
        lines = [
            "You can call these tools:",
            json.dumps(described, ensure_ascii=False),
            'To call a tool, reply with {"name": <tool name>, "arguments": <arguments object>}.',
        ]
        if self.allow_answer:
            lines.append('To answer directly, reply with {"answer": <your answer>}.')
        return "\n".join(lines)

    def schema(self) -> dict[str, Any]:
        """The JSON schema every reply must match."""
        options: list[dict[str, Any]] = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool["function"]["name"]},
                    "arguments": tool["function"].get("parameters") or {"type": "object"},
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for tool in self.tools
        ]
        if self.allow_answer:
            options.append(_ANSWER)
        return {"anyOf": options}


def plan_tools(request: ChatRequest, *, answer_after_tool_result: bool) -> ToolPlan | None:
    """The tool plan for ``request``, or ``None`` when it generates free text."""
    tools = request.tools
    choice = request.body.get("tool_choice")
    if not tools or choice == "none":
        return None
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        return ToolPlan([t for t in tools if t["function"]["name"] == name], allow_answer=False)
    if choice == "required":
        return ToolPlan(tools, allow_answer=False)
    if answer_after_tool_result and request.messages[-1].get("role") == "tool":
        # A tiny model asked again right after a tool result tends to repeat the call.
        return ToolPlan([], allow_answer=True)
    return ToolPlan(tools, allow_answer=True)


def _text(content: object) -> str:
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
        content = _text(message.get("content"))
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
