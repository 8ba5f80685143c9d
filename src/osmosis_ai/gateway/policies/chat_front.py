"""The chat front: chat-completions requests to exact prompt ids, and generations back.

Every policy that generates from token ids sits on it (the engines of ``engines/``, verl's
servers): it renders the model's chat template to the exact prompt ids, plans tool calls
(``_tool_prompt``: an instruction plus a JSON grammar), parses replies, and builds the
OpenAI answer with the token data the gateway records for training (prompt ids, completion
ids, one behaviour logprob per token, the weight version). Nothing here generates.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from osmosis_ai.errors import ChatRequestError
from osmosis_ai.gateway.policies._prompt_tokens import PieceTokenizer
from osmosis_ai.gateway.policies._tool_prompt import (
    ToolPlan,
    plan_tools,
    render_messages,
    reply_message,
)
from osmosis_ai.gateway.policies.base import requested_max_tokens
from osmosis_ai.gateway.policies.engines.base import (
    Generation,
    GenerationRequest,
    JsonGrammar,
    Sampling,
)
from osmosis_ai.gateway.request import ChatRequest

__all__ = [
    "ChatFront",
    "PreparedCall",
    "bounded_strings",
    "completion_response",
    "template_messages",
]

DEFAULT_MAX_TOKENS = 1_024
# JSON replies may lay themselves out as the model likes (it was trained on indented JSON;
# a forced one-line layout pushes it off its own tokens), bounded so it cannot run on.
_MAX_WHITESPACE = 12


def bounded_strings(schema: Any, max_length: int) -> Any:
    """``schema`` with a ``maxLength`` on every string that has no bound of its own.

    A small model writing an unbounded JSON string can run on until ``max_tokens``;
    strings with ``maxLength``, ``pattern``, ``enum``, ``const`` or ``format`` are kept.
    """
    if isinstance(schema, list):
        return [bounded_strings(item, max_length) for item in schema]
    if not isinstance(schema, dict):
        return schema
    bounded = {key: bounded_strings(value, max_length) for key, value in schema.items()}
    if schema.get("type") == "string" and not {
        "maxLength",
        "pattern",
        "enum",
        "const",
        "format",
    } & set(schema):
        bounded["maxLength"] = max_length
    return bounded


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages as Hugging Face chat templates take them.

    Templates render a tool call's ``arguments`` as an object (``| tojson``); OpenAI sends
    a JSON string, so valid JSON objects are decoded. Everything else is kept as sent.
    """
    converted: list[dict[str, Any]] = []
    for message in messages:
        calls = message.get("tool_calls")
        if not calls:
            converted.append(message)
            continue
        converted.append({**message, "tool_calls": [_decoded_call(call) for call in calls]})
    return converted


def _decoded_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except ValueError:
            return call
        if isinstance(decoded, dict):
            return {**call, "function": {**function, "arguments": decoded}}
    return call


def completion_response(
    *,
    model: str,
    prompt_ids: list[int],
    token_ids: list[int],
    logprobs: Sequence[float],
    message: dict[str, Any],
    finish_reason: str,
    pieces: Sequence[str] | None = None,
    top_logprobs: Sequence[Sequence[tuple[str, int, float]]] | None = None,
    version: int | None = None,
    grammar: str | None = None,
) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` carrying the exact token data of one generation.

    ``pieces`` (each token's text) and ``top_logprobs`` (per token, (text, id, logprob)
    alternatives) fill in the ``logprobs`` entries a caller may have asked for; without
    ``pieces`` the entries hold only ids and logprobs (what the call record needs).
    ``version`` is reported as ``policy_version`` and ``grammar`` (the EBNF text the engine
    constrained the completion with) as ``grammar``: both are recorded, then removed from
    what the caller gets. The id lists are used as they are (an
    answer is built once per call, on a hot path), not copied.
    """
    entries: list[dict[str, Any]]
    if pieces is None:
        entries = [
            {"id": token, "logprob": logprob}
            for token, logprob in zip(token_ids, logprobs, strict=True)
        ]
    else:
        alternatives = top_logprobs if top_logprobs is not None else [()] * len(token_ids)
        entries = [
            {
                "token": piece,
                "id": token,
                "logprob": logprob,
                "top_logprobs": [
                    {"token": text, "id": alt, "logprob": value} for text, alt, value in top
                ],
            }
            for piece, token, logprob, top in zip(
                pieces, token_ids, logprobs, alternatives, strict=True
            )
        ]
    response: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "prompt_token_ids": prompt_ids,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason,
                "token_ids": token_ids,
                "logprobs": {"content": entries},
            }
        ],
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(token_ids),
            "total_tokens": len(prompt_ids) + len(token_ids),
        },
    }
    if version is not None:
        response["policy_version"] = version
    if grammar is not None:
        response["grammar"] = grammar
    return response


@dataclass(frozen=True, slots=True)
class PreparedCall:
    """A request turned into what an engine generates, and what its answer needs."""

    generation: GenerationRequest
    plan: ToolPlan | None
    """The tool plan the reply is parsed with (``None``: free text)."""


class ChatFront:
    """A model's chat side: its template, tokenizer and tool plan (blocking CPU work).

    Its methods are blocking: keep all but short ones off the event loop (an engine policy
    runs them on a thread of its own). They only read the tokenizer (every encode uses the
    same settings, so the fast tokenizer is never reconfigured), so threads may share it.

    Args:
        tokenizer: The model's Hugging Face tokenizer (with its chat template).
        context_length: The model's context (prompt + completion), if it has one.
        max_tokens_cap: The completion cap when a request sets none.
        max_string_length: ``maxLength`` given to unbounded strings in tool arguments.
        answer_after_tool_result: Constrain an ``auto`` turn right after a tool result to
            an answer, as the embedded policy does.
        chat_template_kwargs: Extra ``apply_chat_template`` arguments (``enable_thinking``).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        context_length: int | None = None,
        max_tokens_cap: int = DEFAULT_MAX_TOKENS,
        max_string_length: int = 64,
        answer_after_tool_result: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.max_tokens_cap = max_tokens_cap
        self.max_string_length = max_string_length
        self.answer_after_tool_result = answer_after_tool_result
        self._template_kwargs = dict(chat_template_kwargs or {})
        self._pieces = PieceTokenizer.of(tokenizer)

    @classmethod
    def of_model(
        cls, model: Any, tokenizer: Any, *, default_max_tokens: int | None = None, **options: Any
    ) -> ChatFront:
        """The front of a transformers ``model``: its context length, and its checkpoint's
        ``generation_config.max_new_tokens`` as the cap unless ``default_max_tokens`` is set."""
        stated = getattr(getattr(model, "generation_config", None), "max_new_tokens", None)
        return cls(
            tokenizer,
            context_length=getattr(model.config, "max_position_embeddings", None),
            max_tokens_cap=default_max_tokens or stated or DEFAULT_MAX_TOKENS,
            **options,
        )

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        """The chat template's text for ``messages`` (and ``tools``), ready for the reply.

        Raises:
            ChatRequestError: The template refuses the conversation (roles, order).
        """
        try:
            text: str = self.tokenizer.apply_chat_template(
                template_messages(messages),
                tools=tools or None,
                add_generation_prompt=True,
                tokenize=False,
                **self._template_kwargs,
            )
        except Exception as exc:  # a template that refuses the conversation
            raise ChatRequestError(
                f"the model's chat template rejected the messages: {type(exc).__name__}: {exc}",
                param="messages",
            ) from exc
        return text

    def encode(self, text: str) -> list[int]:
        """The ids of rendered ``text`` (no special tokens added around it)."""
        if self._pieces is not None:  # only the text the tokenizer has not seen is encoded
            return self._pieces.encode(text)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return [int(token) for token in ids]

    def encode_if_known(self, text: str, max_new_chars: int) -> list[int] | None:
        """`encode` when at most ``max_new_chars`` of ``text`` were never encoded before
        (cheap enough for the event loop), else ``None``, having done nothing."""
        if self._pieces is None:
            return None
        return self._pieces.encode_if_known(text, max_new_chars)

    def prepare(self, request: ChatRequest, refused: Collection[str] = ()) -> PreparedCall:
        """The generation ``request`` asks for: prompt ids, sampling and grammar.

        Raises:
            ChatRequestError: A field in ``refused`` (the engine cannot honour it), a bad
                sampling value, or a prompt that leaves no room for ``max_tokens``.
        """
        body = request.body
        for name in refused:
            if body.get(name) is not None:
                raise ChatRequestError(
                    f"this policy does not support {name!r}; remove it (it samples with "
                    "temperature, top_p, top_k, max_tokens, seed and stop)",
                    param=name,
                )
        plan = plan_tools(request, answer_after_tool_result=self.answer_after_tool_result)
        prompt_ids = self.encode(self.render(render_messages(request.messages, plan)))
        max_tokens = requested_max_tokens(request, self.max_tokens_cap)
        context = self.context_length
        if context is not None and len(prompt_ids) + max_tokens > context:
            raise ChatRequestError(
                f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({max_tokens}) exceed "
                f"the model's context of {context} tokens; shorten the messages or lower "
                "max_tokens",
                param="messages",
            )
        sampling = Sampling(
            temperature=float(_field(body, "temperature", 1.0)),
            top_p=float(_field(body, "top_p", 1.0)),
            top_k=_field(body, "top_k", 0, integer=True),
            max_tokens=max_tokens,
            seed=_field(body, "seed", None, integer=True),
            stop=_stops(body.get("stop")),
            top_logprobs=_field(body, "top_logprobs", 0, integer=True),
        )
        return PreparedCall(
            GenerationRequest(prompt_ids, sampling, grammar=self._grammar(body, plan)), plan
        )

    def _grammar(self, body: dict[str, Any], plan: ToolPlan | None) -> JsonGrammar | None:
        if plan is not None:
            # Only tool arguments are bounded: an answer may be as long as max_tokens allows.
            tools = [_bounded_tool(tool, self.max_string_length) for tool in plan.tools]
            schema = ToolPlan(tools, allow_answer=plan.allow_answer).schema()
            return JsonGrammar(json.dumps(schema), max_whitespace=_MAX_WHITESPACE)
        response_format = body.get("response_format") or {}
        if response_format.get("type") == "json_object":  # OpenAI: any JSON object
            return JsonGrammar(json.dumps({"type": "object"}), max_whitespace=None)
        if response_format.get("type") == "json_schema":
            schema = (response_format.get("json_schema") or {}).get("schema") or {}
            return JsonGrammar(json.dumps(schema), max_whitespace=_MAX_WHITESPACE)
        return None

    def answer(self, call: PreparedCall, generation: Generation, *, model: str) -> dict[str, Any]:
        """The ``chat.completion`` of ``generation``: the reply parsed with the call's plan,
        each token's text and alternatives, the exact ids, logprobs and weight version."""
        text = self.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        if generation.stop_at is not None:
            text = text[: generation.stop_at]
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish_reason: str = generation.finish_reason
        if call.plan is not None:
            message, tool_finish = reply_message(text)
            finish_reason = tool_finish or finish_reason
        pieces = self.tokenizer.batch_decode([[token] for token in generation.token_ids])
        top = [
            [(self.tokenizer.decode([alt]), alt, value) for alt, value in alternatives]
            for alternatives in generation.top_logprobs
        ]
        return completion_response(
            model=model,
            prompt_ids=call.generation.prompt_ids,
            token_ids=generation.token_ids,
            logprobs=generation.logprobs,
            message=message,
            finish_reason=finish_reason,
            pieces=pieces,
            top_logprobs=top or None,
            version=generation.version,
            grammar=generation.grammar,
        )


def _field(body: dict[str, Any], name: str, default: Any, *, integer: bool = False) -> Any:
    value = body.get(name)
    if value is None:
        return default
    wrong_type = not isinstance(value, int | float) or (integer and not isinstance(value, int))
    if isinstance(value, bool) or wrong_type or value < 0:
        kind = "an integer" if integer else "a number"
        raise ChatRequestError(f"{name!r} must be {kind} of at least 0", param=name)
    return value


def _stops(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(item, str) for item in stop):
        return tuple(stop)
    raise ChatRequestError("'stop' must be a string or a list of strings", param="stop")


def _bounded_tool(tool: dict[str, Any], max_length: int) -> dict[str, Any]:
    function = tool["function"]
    parameters = bounded_strings(function.get("parameters") or {"type": "object"}, max_length)
    return {**tool, "function": {**function, "parameters": parameters}}
