"""The chat front: chat-completions requests to exact prompt ids, and generations back.

Every policy that generates from token ids sits on it (the engines of ``engines/``, verl's
servers): it renders the model's chat template to the exact prompt ids, plans tool calls
(``_tool_prompt``: an instruction plus a JSON grammar), parses replies, and builds the
OpenAI answer with the token data the gateway records for training (prompt ids, completion
ids, one behaviour logprob per token, the weight version). A call that continues an earlier
call of its rollout is prompted with that call's exact ids (``_history``), so the model's own
replies are never re-tokenised either. Nothing here generates.
"""

from __future__ import annotations

import json
import time
import uuid
from array import array
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from osmosis_ai.errors import ChatRequestError
from osmosis_ai.gateway.policies._history import History, Turn, message_meaning
from osmosis_ai.gateway.policies._prompt_tokens import PieceTokenizer
from osmosis_ai.gateway.policies._tool_prompt import (
    JSON_WHITESPACE,
    ToolPlan,
    plan_tools,
    render_messages,
)
from osmosis_ai.gateway.policies.base import requested_max_tokens
from osmosis_ai.gateway.policies.engines.base import (
    Generation,
    GenerationRequest,
    Grammar,
    JsonGrammar,
    Sampling,
)
from osmosis_ai.gateway.policies.tool_formats import (
    NativePlan,
    ToolFormatSetting,
    native_format,
    plan_native_tools,
)
from osmosis_ai.gateway.request import ChatRequest

__all__ = [
    "ChatFront",
    "PreparedCall",
    "Prompt",
    "PromptParts",
    "bounded_strings",
    "completion_response",
    "template_messages",
]

DEFAULT_MAX_TOKENS = 1_024
#: Why an earlier call's text cannot be replayed (`ChatFront._replayed_text`).
_CUT_SHORT = object()
_RENDERED_OTHERWISE = object()
#: How one request uses tools: in the instruction format or the model's own.
Plan = ToolPlan | NativePlan


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
    sampling: Sampling | None = None,
    history_rewritten: bool = False,
) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` carrying the exact token data of one generation.

    ``pieces`` (each token's text) and ``top_logprobs`` (per token, (text, id, logprob)
    alternatives) fill in the ``logprobs`` entries a caller may have asked for; without
    ``pieces`` the entries hold only ids and logprobs (what the call record needs).
    ``version`` is reported as ``policy_version``, ``grammar`` (the Lark text the engine
    constrained the completion with) as ``grammar`` and the temperature, top-p and top-k the
    engine sampled with as ``sampling``, and ``history_rewritten`` (the prompt continues an
    earlier call whose text the chat template rendered otherwise this time) as
    ``history_rewritten``: all are recorded, then removed from what the caller gets. The id
    lists are used as they are (an
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
    if history_rewritten:
        response["history_rewritten"] = True
    if sampling is not None:
        response["sampling"] = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
        }
    return response


@dataclass(frozen=True, slots=True)
class Prompt:
    """A call's prompt: its ids and the template text they stand for."""

    ids: list[int]
    text: str
    rollout_id: str | None
    messages: tuple[Hashable, ...]
    """The meanings of the request's messages (``_history.message_meaning``)."""
    history_rewritten: bool = False
    """The messages continue an earlier call of the rollout, but the chat template renders
    that call's prompt and reply otherwise now (a template that drops earlier reasoning):
    the prompt is rendered afresh, and a trainer starts a new sequence at it."""


@dataclass(frozen=True, slots=True)
class PromptParts:
    """A prompt before its new text is encoded: the ids it replays, and the text after them."""

    text: str
    rollout_id: str | None
    messages: tuple[Hashable, ...]
    replayed: list[int]
    """An earlier call's prompt and completion ids this prompt continues (or none)."""
    rest: str
    """The template's text after them, still to encode."""
    history_rewritten: bool = False
    """See `Prompt.history_rewritten`."""

    def prompt(self, rest_ids: list[int]) -> Prompt:
        """The prompt, given the ids of `rest`."""
        return Prompt(
            [*self.replayed, *rest_ids],
            self.text,
            self.rollout_id,
            self.messages,
            self.history_rewritten,
        )


@dataclass(frozen=True, slots=True)
class PreparedCall:
    """A request turned into what an engine generates, and what its answer needs."""

    generation: GenerationRequest
    plan: Plan | None
    """The tool plan the reply is parsed with (``None``: free text)."""
    prompt: Prompt


class ChatFront:
    """A model's chat side: its template, tokenizer and tool plan (blocking CPU work).

    Its methods are blocking: keep all but short ones off the event loop (an engine policy
    runs them on a thread of its own). They only read the tokenizer (every encode uses the
    same settings, so the fast tokenizer is never reconfigured), so threads may share it.

    Tools are called in the model's own format when its chat template renders tools in a
    format known here (``tool_formats``: hermes's ``<tool_call>``), else in the
    instruction format (``_tool_prompt``); ``tool_format`` forces either.

    Args:
        tokenizer: The model's Hugging Face tokenizer (with its chat template).
        context_length: The model's context (prompt + completion), if it has one.
        max_tokens_cap: The completion cap when a request sets none.
        max_string_length: ``maxLength`` given to unbounded strings in tool arguments.
        answer_after_tool_result: In the instruction format, constrain an ``auto`` turn
            right after a tool result to an answer, as the embedded policy does.
        chat_template_kwargs: Extra ``apply_chat_template`` arguments (``enable_thinking``).
        tool_format: ``auto`` (the model's own format when its template has one),
            ``native`` (required) or ``instruction``.

    Raises:
        ConfigError: An unknown ``tool_format``, or ``native`` for a template without one.
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
        tool_format: ToolFormatSetting = "auto",
    ) -> None:
        self.tokenizer = tokenizer
        self.tool_format = native_format(tokenizer, tool_format)
        """The model's own tool-call format, or ``None``: the instruction format."""
        self.context_length = context_length
        self.max_tokens_cap = max_tokens_cap
        self.max_string_length = max_string_length
        self.answer_after_tool_result = answer_after_tool_result
        self._template_kwargs = dict(chat_template_kwargs or {})
        self._pieces = PieceTokenizer.of(tokenizer)
        self.history = History()
        """The rollouts' answered calls, which later calls continue exactly."""
        self._special_ids = _special_token_ids(tokenizer)

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
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        generation_prompt: bool = True,
    ) -> str:
        """The chat template's text for ``messages`` (and ``tools``), ready for the reply
        (without ``generation_prompt``: the conversation as it stands).

        Raises:
            ChatRequestError: The template refuses the conversation (roles, order).
        """
        try:
            text: str = self.tokenizer.apply_chat_template(
                template_messages(messages),
                tools=tools or None,
                add_generation_prompt=generation_prompt,
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
        plan = self._plan(request)
        if plan is not None:
            prompt = self.prompt(request, plan.render, plan.template_tools)
        elif self.tool_format is not None:  # the template renders the history's calls
            prompt = self.prompt(request, _as_sent)
        else:
            prompt = self.prompt(request, lambda messages: render_messages(messages, None))
        prompt_ids = prompt.ids
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
            GenerationRequest(
                prompt_ids,
                sampling,
                grammar=self._grammar(body, plan),
                session=request.rollout_id,
            ),
            plan,
            prompt,
        )

    def prompt(
        self,
        request: ChatRequest,
        rendered: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
        tools: list[dict[str, Any]] | None = None,
    ) -> Prompt:
        """The prompt of ``request`` (see `prompt_parts`), encoded (blocking)."""
        parts = self.prompt_parts(request, rendered, tools)
        return parts.prompt(self.encode(parts.rest))

    def prompt_parts(
        self,
        request: ChatRequest,
        rendered: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
        tools: list[dict[str, Any]] | None = None,
    ) -> PromptParts:
        """The prompt of ``request``, all but the encoding of its new text: its messages as
        ``rendered`` turns them into template messages (the tool plan's instruction, ...),
        rendered with ``tools``.

        When the messages continue an earlier answered call of the rollout (its messages,
        then its reply, then more) and the template renders that call's prompt unchanged,
        then its reply up to an end-of-turn token that ends the completion too, the ids
        start with that call's prompt ids + completion ids, and only the text after that
        token is new: the model's reply is replayed as it generated it, not re-tokenised.
        When the template renders that earlier call otherwise now (it drops earlier reasoning
        once a new user turn follows, say), the prompt is the fresh rendering, marked
        ``history_rewritten``: its ids are the template's, never spliced or invented.
        """
        text = self.render(rendered(request.messages), tools)
        messages = tuple(message_meaning(message) for message in request.messages)
        rollout = request.rollout_id
        turn = self.history.continued(rollout, messages) if rollout is not None else None
        rewritten = False
        if turn is not None:
            through = rendered(request.messages[: len(turn.messages) + 1])
            replayed = self._replayed_text(turn, through, tools)
            if isinstance(replayed, str) and text.startswith(replayed):
                ids = [*turn.prompt_ids, *turn.completion_ids]
                return PromptParts(text, rollout, messages, ids, text[len(replayed) :])
            rewritten = replayed is not _CUT_SHORT
        return PromptParts(text, rollout, messages, [], text, rewritten)

    def _replayed_text(
        self, turn: Turn, through_reply: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> str | object:
        """The template's text of ``turn``'s conversation up to the end-of-turn token that
        closes its reply, when the completion ended with that token and the template renders
        the turn's prompt unchanged before it; ``_CUT_SHORT`` when the completion has no
        end-of-turn token to cut at; ``_RENDERED_OTHERWISE`` when the template renders the
        turn's prompt or reply otherwise now."""
        if not turn.completion_ids or turn.completion_ids[-1] not in self._special_ids:
            return _CUT_SHORT  # max_tokens, a stop string
        end = self.tokenizer.convert_ids_to_tokens(turn.completion_ids[-1])
        history = self.render(through_reply, tools, generation_prompt=False)
        if not history.startswith(turn.prompt_text):
            return _RENDERED_OTHERWISE
        position = history.find(end, len(turn.prompt_text))
        return _RENDERED_OTHERWISE if position < 0 else history[: position + len(end)]

    def remember(self, prompt: Prompt, message: dict[str, Any], completion_ids: list[int]) -> None:
        """Keep an answered call of a rollout, for the calls that continue it."""
        if prompt.rollout_id is None or not completion_ids:
            return
        turn = Turn(
            prompt.messages,
            message_meaning(message),
            prompt.text,
            array("q", prompt.ids),
            array("q", completion_ids),
        )
        self.history.remember(prompt.rollout_id, turn)

    def _plan(self, request: ChatRequest) -> Plan | None:
        if self.tool_format is not None:
            return plan_native_tools(request, self.tool_format)
        # The instruction stays the same text on every call, so history replays exactly.
        return plan_tools(
            request, answer_after_tool_result=self.answer_after_tool_result, stable=True
        )

    def _grammar(self, body: dict[str, Any], plan: Plan | None) -> Grammar | None:
        if plan is not None:
            # Only tool arguments are bounded: an answer may be as long as max_tokens allows.
            bound = self.max_string_length
            return plan.grammar(lambda parameters: bounded_strings(parameters, bound))
        response_format = body.get("response_format") or {}
        if response_format.get("type") == "json_object":  # OpenAI: any JSON object
            return JsonGrammar(json.dumps({"type": "object"}), max_whitespace=None)
        if response_format.get("type") == "json_schema":
            schema = (response_format.get("json_schema") or {}).get("schema") or {}
            return JsonGrammar(json.dumps(schema), max_whitespace=JSON_WHITESPACE)
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
            message, tool_finish = call.plan.reply(text)
            finish_reason = tool_finish or finish_reason
        self.remember(call.prompt, message, generation.token_ids)
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
            sampling=call.generation.sampling,
            history_rewritten=call.prompt.history_rewritten,
        )


def _as_sent(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return messages


def _special_token_ids(tokenizer: Any) -> frozenset[int]:
    """The ids of the tokenizer's special tokens (end-of-turn tokens among them)."""
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(index for index, token in added.items() if getattr(token, "special", False))
    return frozenset(int(index) for index in ids)


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
