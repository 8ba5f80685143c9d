"""Plain ASGI pieces of the rollout server: JSON answers, body reading, bearer auth."""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["BearerAuth", "BodyError", "json_response", "raw_json_response", "read_json"]

#: Largest body the server reads.
MAX_BODY_BYTES = 32 * 1024 * 1024


class BodyError(Exception):
    """A request body that cannot be read as JSON; answered with ``status``."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(str(detail))
        self.status = status
        self.detail = detail


def raw_json_response(
    body: bytes, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """An already-encoded JSON answer."""
    return Response(body, status, headers=headers, media_type="application/json")


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON answer."""
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    return raw_json_response(body, status, headers)


async def read_json(request: Request) -> Any:
    """The request body parsed as JSON, at most ``MAX_BODY_BYTES``.

    Raises:
        BodyError: Too large (413), or not JSON (422, as FastAPI-style servers answer).
    """
    declared = request.headers.get("content-length", "")
    too_large = BodyError(413, f"request body exceeds {MAX_BODY_BYTES // (1024 * 1024)} MiB")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except UnicodeDecodeError as exc:
        raise BodyError(422, "request body is not UTF-8 JSON") from exc
    except json.JSONDecodeError as exc:
        raise BodyError(
            422,
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
        ) from exc
    except RecursionError as exc:
        raise BodyError(422, "request body is nested too deeply") from exc


class BearerAuth:
    """Requires ``Authorization: Bearer <key>`` on every HTTP request (constant-time check)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self._expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            presented = b""
            for name, value in scope["headers"]:
                if name == b"authorization":
                    presented = value
                    break
            if not hmac.compare_digest(presented, self._expected):
                await json_response({"detail": "unauthorized"}, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)
