"""What one chat-completions call produced: usage, finish reason, token ids and logprobs.

Policies return OpenAI-shaped responses and chunks extended the way vLLM does it: a
top-level ``prompt_token_ids`` and a per-choice ``token_ids``; per-token ``logprobs`` use
OpenAI's ``{"content": [{"logprob": ..., "id"?: ...}]}`` (llama.cpp adds the token ``id``).
These helpers read those fields once, for the call record, and remove what the caller did
not ask for before the answer leaves the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from osmosis_ai.gateway.request import ChatRequest

__all__ = ["CallData", "StreamAccumulator", "call_data_from_response", "strip_for_caller"]


@dataclass(slots=True)
class CallData:
    """Facts about one call, gathered from the policy's answer."""

    model: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_version: int | None = None
    """Training step of the weights that answered (policies serving live weights set it)."""
    grammar: str | None = None
    """Lark text of the grammar the completion was generated under (engines that enforce one)."""
    temperature: float | None = None
    """The temperature, top-p and top-k the completion was sampled with (our engines report
    them): the learner scores its tokens under the same distribution."""
    top_p: float | None = None
    top_k: int | None = None
    history_rewritten: bool = False
    """The chat template rendered an earlier call of the rollout otherwise in this prompt
    (``chat_front.Prompt.history_rewritten``)."""

    def absorb_choice(self, choice: dict[str, Any]) -> None:
        """Add one choice's (or one streamed delta's) tokens and finish reason."""
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        token_ids = choice.get("token_ids")
        explicit_ids = isinstance(token_ids, list)
        if explicit_ids:
            self.completion_token_ids.extend(token_ids)  # type: ignore[arg-type]
        logprobs = choice.get("logprobs")
        entries = logprobs.get("content") if isinstance(logprobs, dict) else None
        for entry in entries or ():
            if not isinstance(entry, dict):
                continue
            if isinstance(entry.get("logprob"), int | float):
                self.logprobs.append(float(entry["logprob"]))
            if not explicit_ids and isinstance(entry.get("id"), int):
                self.completion_token_ids.append(entry["id"])

    def absorb_envelope(self, obj: dict[str, Any]) -> None:
        """Take model, usage and prompt token ids from a response or chunk."""
        if isinstance(obj.get("model"), str):
            self.model = obj["model"]
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        if isinstance(obj.get("prompt_token_ids"), list):
            self.prompt_token_ids = obj["prompt_token_ids"]
        if isinstance(obj.get("policy_version"), int):
            self.policy_version = obj["policy_version"]
        if isinstance(obj.get("grammar"), str):
            self.grammar = obj["grammar"]
        if obj.get("history_rewritten") is True:
            self.history_rewritten = True
        sampling = obj.get("sampling")
        if isinstance(sampling, dict):
            self.temperature = _number(sampling.get("temperature"), float)
            self.top_p = _number(sampling.get("top_p"), float)
            self.top_k = _number(sampling.get("top_k"), int)


def _number(value: object, kind: type[Any]) -> Any:
    """``value`` as a ``kind`` (``int`` or ``float``) when it is one (never a bool), else
    ``None``."""
    accepted = int if kind is int else int | float
    return kind(value) if isinstance(value, accepted) and not isinstance(value, bool) else None


def call_data_from_response(response: dict[str, Any]) -> CallData:
    """Gather the call facts of a non-streamed ``chat.completion``."""
    data = CallData()
    data.absorb_envelope(response)
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        data.absorb_choice(choices[0])
    return data


class StreamAccumulator:
    """Gathers the call facts of a stream, chunk by chunk."""

    def __init__(self) -> None:
        self.data = CallData()

    def feed(self, chunk: dict[str, Any]) -> None:
        """Read one ``chat.completion.chunk``."""
        self.data.absorb_envelope(chunk)
        choices = chunk.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict) and choice.get("index", 0) == 0:
                    self.data.absorb_choice(choice)


def strip_for_caller(obj: dict[str, Any], request: ChatRequest) -> dict[str, Any] | None:
    """Remove from a response or chunk what the caller did not ask for, in place.

    Returns ``None`` for a usage-only stream chunk the caller did not ask for.
    """
    # Recorded; not part of an OpenAI answer.
    obj.pop("policy_version", None)
    obj.pop("grammar", None)
    obj.pop("sampling", None)
    obj.pop("history_rewritten", None)
    if not request.want_token_ids:
        obj.pop("prompt_token_ids", None)
    choices = obj.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if not request.want_token_ids:
                choice.pop("token_ids", None)
            if not request.want_logprobs:
                choice.pop("logprobs", None)
    if request.stream and not request.include_usage and "usage" in obj:
        if not choices:
            return None
        obj.pop("usage", None)
    return obj
