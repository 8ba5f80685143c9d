"""The policy interface: what answers chat completions behind the gateway."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import Any

from osmosis_ai.gateway.request import ChatRequest

__all__ = ["Policy", "chunks_of", "requested_max_tokens"]


class Policy(ABC):
    """A model backend the gateway forwards validated requests to.

    ``complete`` returns an OpenAI ``chat.completion`` object and ``stream`` yields
    ``chat.completion.chunk`` objects, the last of which carries ``usage``. Either may add
    vLLM-style token data (top-level ``prompt_token_ids``, per-choice ``token_ids``, and
    ``logprobs``); the gateway records it and strips what the caller did not ask for.
    Failures raise ``PolicyError`` (or ``ChatRequestError`` for a request the backend
    rejects); the gateway redacts their messages with ``secrets()``.
    """

    #: Short name of the policy kind (``embedded``, ``openai``, ``litellm``).
    kind: str = ""

    @property
    @abstractmethod
    def model(self) -> str:
        """The model name reported in answers and ``/v1/models``."""

    async def start(self) -> None:  # noqa: B027 -- optional hook, nothing to do by default
        """Acquire resources (load a model, open a connection pool)."""

    async def aclose(self) -> None:  # noqa: B027 -- optional hook, nothing to do by default
        """Release resources; in-flight calls are finished or cancelled first."""

    def secrets(self) -> tuple[str, ...]:
        """Values that must never appear in answers, errors or logs (provider keys)."""
        return ()

    def forget(self, rollout_id: str) -> None:  # noqa: B027 -- optional hook
        """Drop what the policy keeps about a rollout whose records were released."""

    @abstractmethod
    async def complete(self, request: ChatRequest) -> dict[str, Any]:
        """Answer ``request`` in one ``chat.completion`` object."""

    @abstractmethod
    def stream(self, request: ChatRequest) -> AsyncIterator[dict[str, Any]]:
        """Answer ``request`` as a stream of ``chat.completion.chunk`` objects."""


def requested_max_tokens(request: ChatRequest, default: int) -> int:
    """The completion cap of ``request`` (``max_tokens`` or ``max_completion_tokens``)."""
    cap = request.body.get("max_tokens") or request.body.get("max_completion_tokens") or default
    return int(cap)


def chunks_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A complete response re-expressed as the chunks a stream of it would have had."""
    envelope = {
        "id": response.get("id"),
        "object": "chat.completion.chunk",
        "created": response.get("created"),
        "model": response.get("model"),
    }
    choice = response["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [
            {"index": index, **call} for index, call in enumerate(message["tool_calls"])
        ]
    first: dict[str, Any] = {
        **envelope,
        "prompt_token_ids": response.get("prompt_token_ids"),
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": choice.get("logprobs"),
                "token_ids": choice.get("token_ids"),
                "finish_reason": None,
            }
        ],
    }
    # Call-record fields, stripped before the caller sees them.
    for recorded in ("policy_version", "grammar", "sampling", "history_rewritten"):
        if recorded in response:
            first[recorded] = response[recorded]
    last = {
        **envelope,
        "choices": [{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}],
    }
    return [first, last, {**envelope, "choices": [], "usage": response.get("usage")}]
