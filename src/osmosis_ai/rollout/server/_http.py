"""A minimal ASGI HTTP layer: requests, JSON answers, bounded JSON bodies.

The rollout server keeps thousands of long polls parked at once; a plain ASGI handler holds
a fraction of the memory and CPU of a framework's middleware stack per parked request.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from osmosis_ai.rollout._nesting import MAX_JSON_DEPTH, nests_deeper_than

__all__ = [
    "MAX_BODY_BYTES",
    "Answer",
    "BodyError",
    "HttpRequest",
    "Receive",
    "Scope",
    "Send",
    "json_answer",
]

#: The ASGI vocabulary.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Largest body the server reads.
MAX_BODY_BYTES = 32 * 1024 * 1024
_MIB = 1024 * 1024


class BodyError(Exception):
    """A request body that cannot be read as JSON; answered with ``status``."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(str(detail))
        self.status = status
        self.detail = detail


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


def json_answer(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Answer:
    """A JSON answer."""
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
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
        """The body parsed as JSON, at most ``MAX_BODY_BYTES`` and ``MAX_JSON_DEPTH`` levels.

        Raises:
            BodyError: Too large (413), not JSON or nested too deeply (422, as
                FastAPI-style servers answer).
        """
        declared = self.header(b"content-length") or ""
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise _too_large(int(declared))
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise BodyError(400, "client disconnected while sending the body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise _too_large(None)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        try:
            value = json.loads(b"".join(chunks))
        except UnicodeDecodeError as exc:
            raise BodyError(422, "request body is not UTF-8 JSON") from exc
        except json.JSONDecodeError as exc:
            where = f"line {exc.lineno} column {exc.colno}"
            raise BodyError(422, f"request body is not valid JSON: {exc.msg} at {where}") from exc
        except RecursionError as exc:
            raise _too_deep() from exc
        if nests_deeper_than(value, MAX_JSON_DEPTH):
            raise _too_deep()
        return value


def _too_deep() -> BodyError:
    return BodyError(
        422,
        f"request body nests deeper than {MAX_JSON_DEPTH} levels, the rollout server's limit "
        "(the request object is level 1); flatten metadata and extra_fields",
    )


def _too_large(size: int | None) -> BodyError:
    limit = f"the rollout server's {MAX_BODY_BYTES // _MIB} MiB limit"
    if size is None:
        return BodyError(413, f"request body exceeds {limit}; shorten the prompt or metadata")
    return BodyError(
        413, f"request body is {size / _MIB:.1f} MiB, over {limit}; shorten the prompt or metadata"
    )
