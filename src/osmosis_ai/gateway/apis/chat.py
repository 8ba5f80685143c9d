"""Chat completions, the policies' own API: nothing to translate but what the caller gets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from osmosis_ai.gateway.apis.base import Api, ApiCall, openai_error_body, sse_event
from osmosis_ai.gateway.calls import CallData, strip_for_caller
from osmosis_ai.gateway.request import ChatRequest, parse_chat_request

__all__ = ["ChatCompletionsApi"]

_DONE = b"data: [DONE]\n\n"


class _ChatCall(ApiCall):
    def __init__(self, chat: ChatRequest) -> None:
        self.chat = chat

    def answer(self, completion: dict[str, Any]) -> dict[str, Any]:
        strip_for_caller(completion, self.chat)
        return completion

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        visible = strip_for_caller(chunk, self.chat)
        return [] if visible is None else [sse_event(visible)]

    def end(self, data: CallData) -> list[bytes]:
        return [_DONE]

    def fail(self, message: str, error_type: str) -> list[bytes]:
        return [sse_event(openai_error_body(message, error_type)), _DONE]


class ChatCompletionsApi(Api):
    """``POST /v1/rollouts/{rollout_id}/chat/completions``."""

    path = "chat/completions"

    def parse(self, payload: object, *, sampling: Mapping[str, Any], rollout_id: str) -> ApiCall:
        return _ChatCall(parse_chat_request(payload, sampling=sampling, rollout_id=rollout_id))
