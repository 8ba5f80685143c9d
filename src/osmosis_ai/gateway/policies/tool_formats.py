"""Tool calls in the model's own format, for a model whose chat template renders tools.

Training a model on a tool format it does not use at inference teaches it the wrong thing.
So when the chat template takes ``tools`` and writes calls in a format known here
(`NativeFormat`, a small registry: hermes's ``<tool_call>`` JSON, used by Qwen and many
others, is the first entry), the template renders the tools and the history, the reply is
generated under a grammar that allows a plain answer or calls in that format (honouring
``tool_choice``), and the format's parser turns the calls back into OpenAI ``tool_calls``.
A template without tools keeps the instruction format (``_tool_prompt``).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal, get_args

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.policies._tool_prompt import JSON_WHITESPACE, Arguments, call_options
from osmosis_ai.gateway.policies.engines.base import JsonGrammar, LarkGrammar
from osmosis_ai.gateway.policies.engines.grammar import tagged_calls_grammar
from osmosis_ai.gateway.request import ChatRequest

__all__ = [
    "FORMATS",
    "MAX_CALLS",
    "NativeFormat",
    "NativePlan",
    "TOOL_FORMAT_SETTINGS",
    "ToolFormatSetting",
    "native_format",
    "plan_native_tools",
]

#: Most calls one reply may make (``parallel_tool_calls: false``: one).
MAX_CALLS = 4
#: ``[sampling] tool_format``: the model's own format when its template has one, or either.
ToolFormatSetting = Literal["auto", "native", "instruction"]
TOOL_FORMAT_SETTINGS: tuple[ToolFormatSetting, ...] = get_args(ToolFormatSetting)


@dataclass(frozen=True, slots=True)
class NativeFormat:
    """A tool-call syntax: each call is ``opening`` + ``{"name", "arguments"}`` JSON +
    ``closing``; a template that contains ``marker`` writes it."""

    name: str
    opening: str
    closing: str
    marker: str

    def detects(self, template: str) -> bool:
        """Whether ``template`` renders tools and writes calls in this format."""
        return "tools" in template and self.marker in template

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The text around the calls (``None`` when there is none) and the calls of a reply,
        as OpenAI ``tool_calls``. Each call's JSON is decoded where its opening tag ends (a
        closing tag inside one of its strings is text); a reply with a call that does not
        parse (cut short) is text, with no calls."""
        opening, closing = self.opening.strip(), self.closing.strip()
        decoder = json.JSONDecoder()
        calls: list[dict[str, Any]] = []
        around: list[str] = []
        position = 0
        while (start := text.find(opening, position)) >= 0:
            around.append(text[position:start])
            try:
                call, end = decoder.raw_decode(text, _after_space(text, start + len(opening)))
            except ValueError:
                return text, []
            end = _after_space(text, end)
            if not (text.startswith(closing, end) and _is_call(call)):
                return text, []
            calls.append(_openai_call(call))
            position = end + len(closing)
        if not calls:
            return text, []
        around.append(text[position:])
        return "".join(around).strip() or None, calls


def _after_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


def _is_call(call: object) -> bool:
    return isinstance(call, dict) and isinstance(call.get("name"), str)


def _openai_call(call: dict[str, Any]) -> dict[str, Any]:
    arguments = call.get("arguments")
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {
            "name": call["name"],
            "arguments": json.dumps(arguments if arguments is not None else {}, ensure_ascii=False),
        },
    }


HERMES = NativeFormat(
    name="hermes", opening="<tool_call>\n", closing="\n</tool_call>", marker="<tool_call>"
)
#: The formats known, by name; another format is a new entry here.
FORMATS = {HERMES.name: HERMES}


def native_format(tokenizer: Any, setting: ToolFormatSetting) -> NativeFormat | None:
    """The tool format a model's calls use under ``setting`` (``None``: the instruction
    format).

    Raises:
        ConfigError: ``setting`` is unknown, or ``native`` for a template that renders no
            tools in a known format.
    """
    if setting not in TOOL_FORMAT_SETTINGS:
        choices = ", ".join(f'"{choice}"' for choice in TOOL_FORMAT_SETTINGS)
        raise ConfigError(f"tool_format must be one of {choices}, not {setting!r}")
    if setting == "instruction":
        return None
    template = getattr(tokenizer, "chat_template", None)
    found = next(
        (f for f in FORMATS.values() if isinstance(template, str) and f.detects(template)), None
    )
    if found is None and setting == "native":
        known = ", ".join(FORMATS)
        raise ConfigError(
            'tool_format = "native", but the model\'s chat template renders no tools in a '
            f'format known here ({known}); use "auto" or "instruction"'
        )
    return found


class NativePlan:
    """How one request uses tools in the model's own format: the template renders the tools
    and the conversation; the grammar admits an answer (``allow_answer``) or calls of the
    ``callable`` tools (default: all), at most ``max_calls``."""

    def __init__(
        self,
        tool_format: NativeFormat,
        tools: list[dict[str, Any]],
        *,
        allow_answer: bool,
        callable: set[str] | None = None,
        max_calls: int = MAX_CALLS,
    ) -> None:
        self.format = tool_format
        self.template_tools = tools
        self.allow_answer = allow_answer
        self.callable = [t for t in tools if callable is None or t["function"]["name"] in callable]
        self.max_calls = max_calls

    def render(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages the template renders: the request's own."""
        return messages

    def grammar(self, arguments: Arguments | None = None) -> LarkGrammar:
        """An answer, or 1 to ``max_calls`` calls of the callable tools in the format."""
        call = JsonGrammar(
            json.dumps({"anyOf": call_options(self.callable, arguments)}),
            max_whitespace=JSON_WHITESPACE,
        )
        return tagged_calls_grammar(
            call,
            self.format.opening,
            self.format.closing,
            allow_answer=self.allow_answer,
            max_calls=self.max_calls,
        )

    def reply(self, text: str) -> tuple[dict[str, Any], str | None]:
        """The assistant message of a reply, and ``"tool_calls"`` when it makes calls."""
        content, calls = self.format.parse(text)
        if not calls:
            return {"role": "assistant", "content": text}, None
        return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"


def plan_native_tools(request: ChatRequest, tool_format: NativeFormat) -> NativePlan | None:
    """The plan of ``request`` in ``tool_format``, or ``None`` when it generates free text."""
    tools = request.tools
    choice = request.body.get("tool_choice")
    if not tools or choice == "none":
        return None
    max_calls = 1 if request.body.get("parallel_tool_calls") is False else MAX_CALLS
    if isinstance(choice, dict):
        name = {choice["function"]["name"]}
        return NativePlan(
            tool_format, tools, allow_answer=False, callable=name, max_calls=max_calls
        )
    return NativePlan(tool_format, tools, allow_answer=choice != "required", max_calls=max_calls)
