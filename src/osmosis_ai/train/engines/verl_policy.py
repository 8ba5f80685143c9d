"""A gateway policy that generates through verl's inference servers, token-in/token-out.

verl's agent loops call ``server_manager.generate(request_id, prompt_ids=..., sampling_params=...)``
(an ``LLMServerClient``): the prompt is token ids, the answer is the sampled ids and their
logprobs. This policy turns a chat-completions request into that call and the answer back into
a ``chat.completion`` on the gateway's chat front (the tokenizer's chat template with the tools,
exact prompt ids, the answer with its token data) and verl's tool parser. The gateway records
the exact ids and logprobs for training.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError, PolicyError
from osmosis_ai.gateway.policies.base import Policy, chunks_of, requested_max_tokens
from osmosis_ai.gateway.policies.chat_front import ChatFront, Prompt, completion_response
from osmosis_ai.gateway.request import ChatRequest

__all__ = ["VerlServerPolicy", "sampling_params_for"]

FEATURE = "The verl adapter"
#: Sampling fields the trainer sets for a rollout; a request cannot change them (verl
#: recomputes the behaviour logprobs at the rollout's temperature).
_TRAINER_OWNED = ("temperature", "top_p", "top_k")
#: Completions up to this many tokens are decoded on the event loop (see ``_message``).
_INLINE_DECODE_TOKENS = 128
#: Prompt text the piece cache has not seen is encoded on the event loop up to this many
#: characters (about 50 us, what a worker-thread hop costs), longer text in a worker thread.
_INLINE_ENCODE_CHARS = 160


def _as_sent(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages the template renders: the request's own (verl's template takes tools)."""
    return messages


def sampling_params_for(
    request: ChatRequest, trainer: Mapping[str, Any] | None, *, max_tokens: int
) -> dict[str, Any]:
    """verl ``sampling_params`` for ``request``.

    The trainer's parameters for the rollout (``trainer``) are the base and win for
    temperature, top_p and top_k; the request's own values apply when no trainer
    parameters are bound. The completion cap is the request's ``max_tokens`` (or
    ``max_completion_tokens``), at most ``max_tokens``; ``logprobs`` is always on.
    """
    params: dict[str, Any] = dict(trainer or {})
    for field in _TRAINER_OWNED:
        value = request.body.get(field)
        if value is not None and field not in params:
            params[field] = value
    params["max_tokens"] = min(requested_max_tokens(request, max_tokens), max_tokens)
    params["logprobs"] = True  # the sampled token's logprob: the call record needs it
    return params


class VerlServerPolicy(Policy):
    """Answers chat completions with verl's ``LLMServerClient`` (the agent loop's server manager).

    Each call renders the messages and tools with the tokenizer's chat template, generates
    with ``request_id`` = the rollout id (verl routes a rollout's turns to one server, for
    its prefix cache), and parses tool calls with verl's parser registry. The answer carries
    the prompt ids, the completion ids and their logprobs exactly as the server returned them.
    Templating, prompt ids and the answer are the chat front's (``ChatFront``): the rendered
    prompt is tokenised piece by piece between added tokens, each piece once, where that
    gives the tokenizer's own ids.

    Args:
        server_manager: verl's ``LLMServerClient`` (``AgentLoopBase.server_manager``).
        tokenizer: The trained model's Hugging Face tokenizer.
        tool_parser: A name in verl's ``ToolParser`` registry (``hermes`` for Qwen-style
            ``<tool_call>`` JSON).
        model: The model name reported in answers.
        max_tokens: Completion cap per call (verl's ``rollout.response_length``).
        chat_template_kwargs: Extra ``apply_chat_template`` arguments (verl's
            ``data.apply_chat_template_kwargs``, e.g. ``enable_thinking``).

    Raises:
        ConfigError: ``tool_parser`` is not registered (the message lists the names).
    """

    kind = "verl"

    def __init__(
        self,
        server_manager: Any,
        tokenizer: Any,
        *,
        tool_parser: str = "hermes",
        model: str = "verl",
        max_tokens: int = 1_024,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        parsers = import_optional(
            "verl.experimental.agent_loop.tool_parser", extra="verl", feature=FEATURE
        )
        try:
            self._parser = parsers.ToolParser.get_tool_parser(tool_parser, tokenizer)
        except ValueError:
            known = ", ".join(sorted(parsers.ToolParser._registry))
            raise ConfigError(
                f"tool_parser {tool_parser!r} is not in verl's tool parser registry; use one "
                f"of: {known}"
            ) from None
        schemas = import_optional("verl.tools.schemas", extra="verl", feature=FEATURE)
        self._tool_schema = schemas.OpenAIFunctionToolSchema
        self._server = server_manager
        self._tokenizer = tokenizer
        self._model = model
        self.max_tokens = max_tokens
        self._front = ChatFront(tokenizer, chat_template_kwargs=chat_template_kwargs)
        self._special_ids = frozenset(int(i) for i in tokenizer.all_special_ids)
        self._sampling: dict[str, dict[str, Any]] = {}

    @property
    def model(self) -> str:
        """The model name reported in answers."""
        return self._model

    @contextlib.contextmanager
    def rollout_sampling(
        self, rollout_id: str, sampling_params: Mapping[str, Any]
    ) -> Iterator[None]:
        """Generate the calls of ``rollout_id`` with the trainer's ``sampling_params``."""
        self._sampling[rollout_id] = dict(sampling_params)
        try:
            yield
        finally:
            self._sampling.pop(rollout_id, None)

    def forget(self, rollout_id: str) -> None:
        """Drop the rollout's answered calls from the front's history."""
        self._front.history.forget(rollout_id)

    async def complete(self, request: ChatRequest) -> dict[str, Any]:
        """One ``chat.completion`` generated by verl's servers, with ids and logprobs."""
        rollout_id = request.rollout_id or f"call-{uuid.uuid4().hex}"
        sampling = sampling_params_for(
            request, self._sampling.get(rollout_id), max_tokens=self.max_tokens
        )
        prompt = await self._prompt(request)
        prompt_ids = prompt.ids
        try:
            output = await self._server.generate(
                rollout_id, prompt_ids=prompt_ids, sampling_params=sampling
            )
        except Exception as exc:
            raise PolicyError(
                f"the verl inference server failed: {type(exc).__name__}: {exc}"
            ) from exc
        if output.stop_reason == "aborted":
            raise PolicyError(
                "the verl inference server aborted the generation (weights were being "
                "updated); retry the call",
                status_code=503,
            )
        token_ids = [int(token) for token in output.token_ids]
        logprobs = [float(value) for value in output.log_probs or ()]
        if len(logprobs) != len(token_ids):
            raise PolicyError(
                f"the verl inference server returned {len(logprobs)} logprobs for "
                f"{len(token_ids)} tokens; the policy needs one logprob per token (it asks "
                "for them with sampling_params['logprobs'])"
            )
        message, finish_reason, pieces = await self._message(
            request, token_ids, sampling["max_tokens"]
        )
        self._front.remember(prompt, message, token_ids)
        return completion_response(
            model=self._model,
            prompt_ids=prompt_ids,
            token_ids=token_ids,
            logprobs=logprobs,
            message=message,
            finish_reason=finish_reason,
            pieces=pieces,
        )

    async def stream(self, request: ChatRequest) -> AsyncIterator[dict[str, Any]]:
        """The whole answer as chunks (verl's servers answer a turn at once)."""
        for chunk in chunks_of(await self.complete(request)):
            yield chunk

    async def _prompt(self, request: ChatRequest) -> Prompt:
        """The request's prompt (a continued call replays the earlier call's exact ids), without
        a worker-thread hop when little text is new.

        The template renders here: Jinja is pure Python, which in a worker thread would hold
        the GIL all the same. An agent's call usually adds a message or two to text the piece
        cache has seen; up to ``_INLINE_ENCODE_CHARS`` new characters are encoded here too.
        """
        parts = self._front.prompt_parts(request, _as_sent, request.tools)
        ids = self._front.encode_if_known(parts.rest, _INLINE_ENCODE_CHARS)
        if ids is None:
            ids = await asyncio.to_thread(self._front.encode, parts.rest)
        return parts.prompt(ids)

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        """The chat template's token ids for ``messages`` and ``tools`` (blocking: CPU work).

        Raises:
            ChatRequestError: The template refuses the conversation.
        """
        return self._front.encode(self._front.render(messages, tools))

    def _decoded(
        self, text_ids: list[int] | None, piece_ids: list[int] | None
    ) -> tuple[str, list[str] | None]:
        """The text of ``text_ids`` ("" for None) and one piece per id of ``piece_ids`` (None
        for None). Blocking CPU work: in a worker thread unless it is short."""
        text = "" if text_ids is None else self._tokenizer.decode(text_ids)
        if piece_ids is None:
            return text, None
        return text, self._tokenizer.batch_decode([[token] for token in piece_ids])

    async def _message(
        self, request: ChatRequest, token_ids: list[int], max_tokens: int
    ) -> tuple[dict[str, Any], str, list[str] | None]:
        ended = bool(token_ids) and token_ids[-1] in self._special_ids
        text_ids = list(token_ids)
        while text_ids and text_ids[-1] in self._special_ids:  # end-of-turn tokens: no text
            text_ids.pop()
        finish = "stop" if ended or len(token_ids) < max_tokens else "length"
        plain = not request.tools or request.body.get("tool_choice") == "none"
        # With tools, verl's parser decodes the text itself. Each token's piece (a few us per
        # token) is only shown to a caller that asked for logprobs.
        text_to_decode = text_ids if plain else None
        pieces_to_decode = token_ids if request.want_logprobs else None
        if pieces_to_decode is None and len(text_to_decode or ()) <= _INLINE_DECODE_TOKENS:
            # At most ~30 us of decoding: less than a worker-thread hop costs (~50 us).
            text, pieces = self._decoded(text_to_decode, None)
        else:
            text, pieces = await asyncio.to_thread(self._decoded, text_to_decode, pieces_to_decode)
        if plain:
            return {"role": "assistant", "content": text}, finish, pieces
        schemas = [self._tool_schema.model_validate(tool) for tool in request.tools]
        content, calls = await self._parser.extract_tool_calls(text_ids, schemas)
        message: dict[str, Any] = {"role": "assistant", "content": content.strip() or None}
        if calls:
            message["tool_calls"] = [
                {
                    "id": call.tool_call_id or f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in calls
            ]
            finish = "tool_calls"
        return message, finish, pieces
