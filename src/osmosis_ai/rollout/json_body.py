"""The one bounded JSON body reader of the package's HTTP servers (rollout server, gateway).

Both servers answer a body they cannot take the same way: 413 naming the body's size and
the limit, 422 for a body that is not UTF-8 JSON or nests past `MAX_JSON_DEPTH` (as the
reference's FastAPI server answers), 400 for a client that hung up mid-body.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any, Final

from osmosis_ai.rollout.nesting import MAX_JSON_DEPTH, nests_deeper_than

__all__ = ["MAX_BODY_BYTES", "BodyError", "asgi_body_chunks", "read_json_body"]

#: Largest body either server reads. Prompts with long histories reach megabytes; a body
#: past this is a mistake, and refusing it early bounds each connection's memory.
MAX_BODY_BYTES: Final = 32 * 1024 * 1024
_MIB: Final = 1024 * 1024


class BodyError(Exception):
    """A request body that cannot be read as JSON; answered with ``status`` and ``detail``."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


async def asgi_body_chunks(
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
) -> AsyncIterator[bytes]:
    """The chunks of an ASGI request's body, as `read_json_body` takes them.

    Raises:
        BodyError: The client hung up before the body ended (400).
    """
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BodyError(400, "client disconnected while sending the body")
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def read_json_body(
    chunks: AsyncIterable[bytes], *, content_length: str | None, server: str
) -> Any:
    """The body parsed as JSON, at most `MAX_BODY_BYTES` and `MAX_JSON_DEPTH` levels.

    Args:
        chunks: The body as it arrives; raise `BodyError` (400) on a disconnect.
        content_length: The ``Content-Length`` header, refused early when over the limit.
        server: The server's name for messages ("rollout server", "gateway").

    Raises:
        BodyError: Too large (413), not UTF-8 JSON or nested too deeply (422).
    """
    declared = content_length or ""
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large(server, int(declared))
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large(server, None)
        parts.append(chunk)
    body = b"".join(parts)
    try:
        value = json.loads(body)
    except UnicodeDecodeError as exc:
        raise BodyError(422, "request body is not UTF-8 JSON") from exc
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise BodyError(422, f"request body is not valid JSON: {exc.msg} at {where}") from exc
    except RecursionError as exc:
        raise _too_deep(server) from exc
    # Every level opens with a '[' or '{' (in any UTF encoding): a body with no more of them
    # than the limit cannot nest past it, and counting bytes costs far less than the walk.
    openers = body.count(b"[") + body.count(b"{")
    if openers > MAX_JSON_DEPTH and nests_deeper_than(value, MAX_JSON_DEPTH):
        raise _too_deep(server)
    return value


def _too_deep(server: str) -> BodyError:
    return BodyError(
        422,
        f"request body nests deeper than {MAX_JSON_DEPTH} levels, the {server}'s limit "
        "(the request object is level 1); flatten the nested fields",
    )


def _too_large(server: str, size: int | None) -> BodyError:
    limit = f"the {server}'s {MAX_BODY_BYTES // _MIB} MiB limit"
    if size is None:
        return BodyError(413, f"request body exceeds {limit}; shorten the messages or metadata")
    return BodyError(
        413,
        f"request body is {size / _MIB:.1f} MiB, over {limit}; shorten the messages or metadata",
    )
