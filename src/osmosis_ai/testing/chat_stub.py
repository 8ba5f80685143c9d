"""``ChatStub``: a real OpenAI-compatible chat-completions server with scripted answers.

It listens on 127.0.0.1 (an ephemeral port), answers instantly, and records every request,
so tests exercise real HTTP without any model. Queue behaviours with ``push``; when the
queue is empty it asks ``respond(body)`` if given (a per-request rule, e.g. for concurrent
conversations), else echoes the last user message.

It also answers vLLM's token-in ``/v1/completions`` (a prompt of token ids in; the reply's
token ids and one logprob per token out), for a chat front in front of a token engine: the
reply's ``token_ids``, else its text through ``encode``, else one made-up id per word. Asked
for ``prompt_logprobs``, it answers them as vLLM does, from ``prompt_logprobs(ids)`` (a
distillation teacher served by a model of the test's); and vLLM's ``/tokenize`` through
``encode``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from osmosis_ai._extras import import_optional
from osmosis_ai._serving import ServedApp

__all__ = ["ChatStub", "StubFailure", "StubReply"]


@dataclass
class StubReply:
    """An assistant answer: text and/or tool calls, after an optional delay."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    token_ids: list[int] | None = None
    """The completion's ids on ``/v1/completions`` (chat answers ignore them)."""
    delay_sec: float = 0.0
    finish_reason: str | None = None
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    )


@dataclass
class StubFailure:
    """An OpenAI-style error answer with HTTP ``status``."""

    status: int
    message: str = "stub failure"
    delay_sec: float = 0.0


Behaviour = StubReply | StubFailure


class ChatStub(ServedApp):
    """A scripted OpenAI-compatible server at ``base_url`` (``http://127.0.0.1:<port>/v1``).

    Attributes:
        requests: Every request received, as ``{"body": ..., "headers": ..., "peer": ...}``;
            ``peer`` is the client's ``"host:port"``, the same for requests that came over
            one connection.
    """

    def __init__(
        self,
        *,
        model: str = "stub-model",
        delay_sec: float = 0.0,
        respond: Callable[[dict[str, Any]], Behaviour] | None = None,
        encode: Callable[[str], list[int]] | None = None,
        prompt_logprobs: Callable[[list[int]], list[float]] | None = None,
    ) -> None:
        self.model = model
        self._respond = respond
        self._encode = encode
        self._prompt_logprobs = prompt_logprobs
        self.delay_sec = delay_sec
        """Delay of the default (echo) answer; change it at any time."""
        self.requests: list[dict[str, Any]] = []
        self._script: deque[Behaviour] = deque()
        starlette = import_optional("starlette.applications", extra="server", feature="ChatStub")
        routing = import_optional("starlette.routing", extra="server", feature="ChatStub")
        super().__init__(
            starlette.Starlette(
                routes=[
                    routing.Route("/v1/chat/completions", self._handle, methods=["POST"]),
                    routing.Route("/v1/completions", self._handle, methods=["POST"]),
                    routing.Route("/tokenize", self._tokenize, methods=["POST"]),
                ]
            )
        )

    def push(self, *behaviours: Behaviour) -> None:
        """Queue behaviours; each request consumes one."""
        self._script.extend(behaviours)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of the running stub."""
        return f"{self.served_url}/v1"

    def _next(self, body: dict[str, Any]) -> Behaviour:
        if self._script:
            return self._script.popleft()
        if self._respond is not None:
            return self._respond(body)
        last = next(
            (
                m.get("content")
                for m in reversed(body.get("messages") or [])
                if m.get("role") == "user"
            ),
            "",
        )
        return StubReply(content=f"echo: {last}", delay_sec=self.delay_sec)

    async def _handle(self, request: Any) -> Any:
        responses = import_optional("starlette.responses", extra="server", feature="ChatStub")
        body = await request.json()
        peer = f"{request.client.host}:{request.client.port}" if request.client else None
        self.requests.append({"body": body, "headers": dict(request.headers), "peer": peer})
        behaviour = self._next(body)
        if behaviour.delay_sec:
            await asyncio.sleep(behaviour.delay_sec)
        if isinstance(behaviour, StubFailure):
            error = {"error": {"message": behaviour.message, "type": "stub_error"}}
            return responses.JSONResponse(error, behaviour.status)
        if request.url.path.endswith("/v1/completions"):
            return responses.JSONResponse(self._token_completion(body, behaviour))
        answer = _completion(self.model, body, behaviour)
        if not body.get("stream"):
            return responses.JSONResponse(answer)
        return responses.StreamingResponse(_sse(answer, body), media_type="text/event-stream")

    async def _tokenize(self, request: Any) -> Any:
        """vLLM's ``POST /tokenize``: the ids of ``prompt`` (404 without ``encode``)."""
        responses = import_optional("starlette.responses", extra="server", feature="ChatStub")
        body = await request.json()
        self.requests.append({"body": body, "headers": dict(request.headers), "peer": None})
        if self._encode is None:
            return responses.JSONResponse({"error": {"message": "Not Found"}}, 404)
        tokens = self._encode(str(body.get("prompt", "")))
        return responses.JSONResponse({"tokens": tokens, "count": len(tokens)})

    def _token_completion(self, body: dict[str, Any], reply: StubReply) -> dict[str, Any]:
        """A vLLM-style ``/v1/completions`` answer: token ids and their logprobs."""
        text = reply.content or ""
        if reply.token_ids is not None:
            ids = list(reply.token_ids)
        elif self._encode is not None:
            ids = self._encode(text)
        else:
            ids = list(range(100, 100 + len(text.split())))
        logprobs = {"tokens": [str(i) for i in ids], "token_logprobs": [-0.5] * len(ids)}
        choice = {"index": 0, "text": text, "token_ids": ids, "logprobs": logprobs,
                  "finish_reason": reply.finish_reason or "stop"}  # fmt: skip
        prompt = body.get("prompt") or []
        if body.get("prompt_logprobs") is not None and self._prompt_logprobs is not None:
            scored = self._prompt_logprobs(list(prompt))
            # vLLM's shape: None for the first token, then each token's logprob by its id.
            choice["prompt_logprobs"] = [None] + [
                {str(token): {"logprob": value, "rank": 1}}
                for token, value in zip(prompt[1:], scored[1:], strict=True)
            ]
        return {
            "id": "cmpl-stub",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt) + len(ids),
            },  # fmt: skip
        }


def _completion(model: str, body: dict[str, Any], reply: StubReply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
    words = (reply.content or "").split(" ") if reply.content else []
    answer: dict[str, Any] = {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or model,
        "choices": [choice],
        "usage": dict(reply.usage),
    }
    if body.get("logprobs"):
        choice["logprobs"] = {
            "content": [{"token": w, "logprob": -0.5, "top_logprobs": []} for w in words]
        }
    if body.get("return_token_ids"):
        answer["prompt_token_ids"] = list(range(reply.usage["prompt_tokens"]))
        choice["token_ids"] = list(range(100, 100 + len(words)))
    return answer


async def _sse(answer: dict[str, Any], body: dict[str, Any]) -> AsyncIterator[bytes]:
    choice = answer["choices"][0]
    message = choice["message"]
    envelope = {k: answer[k] for k in ("id", "created", "model")} | {
        "object": "chat.completion.chunk"
    }
    content = message.get("content") or ""
    pieces = [p + " " for p in content.split(" ")] if content else []
    if pieces:
        pieces[-1] = pieces[-1][:-1]
    entries = (choice.get("logprobs") or {}).get("content") or []
    token_ids = choice.get("token_ids") or []
    for index, piece in enumerate(pieces or [""]):
        delta: dict[str, Any] = {"content": piece}
        if index == 0:
            delta["role"] = "assistant"
            if message.get("tool_calls"):
                delta["tool_calls"] = [
                    {"index": i, **call} for i, call in enumerate(message["tool_calls"])
                ]
        chunk_choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
        if index < len(entries):
            chunk_choice["logprobs"] = {"content": [entries[index]]}
        if index < len(token_ids):
            chunk_choice["token_ids"] = [token_ids[index]]
        chunk: dict[str, Any] = {**envelope, "choices": [chunk_choice]}
        if index == 0 and "prompt_token_ids" in answer:
            chunk["prompt_token_ids"] = answer["prompt_token_ids"]
        yield _event(chunk)
    yield _event(
        {
            **envelope,
            "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
        }
    )
    if (body.get("stream_options") or {}).get("include_usage"):
        yield _event({**envelope, "choices": [], "usage": answer["usage"]})
    yield b"data: [DONE]\n\n"


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"
