"""A minimal ASGI HTTP layer: requests, JSON answers, bounded JSON bodies (`json_body`).

The rollout server keeps thousands of long polls parked at once; a plain ASGI handler holds
a fraction of the memory and CPU of a framework's middleware stack per parked request.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from osmosis_ai.rollout.json_body import (
    MAX_BODY_BYTES,
    BodyError,
    asgi_body_chunks,
    read_json_body,
)

__all__ = [
    "MAX_BODY_BYTES",
    "Answer",
    "BodyError",
    "HttpRequest",
    "Receive",
    "Scope",
    "Send",
    "encode_json",
    "json_answer",
]

#: The ASGI vocabulary.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass(slots=True)
class Answer:
    """An HTTP answer with an already-encoded JSON body."""

    body: bytes
    status: int = 200
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    async def send(self, send: Send) -> None:
        """Send the answer on an ASGI connection."""
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.body)).encode()),
            *self.headers,
        ]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


# Built once: ``json.dumps`` with options builds a new encoder on every call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def encode_json(data: Any) -> bytes:
    """``data`` as compact UTF-8 JSON, the encoding of every answer the server builds."""
    return _ENCODER.encode(data).encode()


def json_answer(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Answer:
    """A JSON answer."""
    body = encode_json(data)
    encoded = [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()]
    return Answer(body, status, encoded)


@dataclass(slots=True)
class HttpRequest:
    """One HTTP request: its method, decoded path, headers and (lazily) body."""

    scope: Scope
    receive: Receive

    @property
    def method(self) -> str:
        method: str = self.scope["method"]
        return method

    @property
    def path(self) -> str:
        path: str = self.scope["path"]
        return path

    def header(self, name: bytes) -> str | None:
        """The first value of header ``name`` (lower-case bytes), decoded as latin-1."""
        for key, value in self.scope["headers"]:
            if key == name:
                text: str = value.decode("latin-1")
                return text
        return None

    async def json(self) -> Any:
        """The body parsed as JSON by the package's one bounded reader.

        Raises:
            BodyError: Too large (413), not JSON or nested too deeply (422, as
                FastAPI-style servers answer), or the client hung up (400).
        """
        return await read_json_body(
            asgi_body_chunks(self.receive),
            content_length=self.header(b"content-length"),
            server="rollout server",
        )
