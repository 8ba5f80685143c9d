"""How `RolloutClient` sends one HTTP request: a small transport interface, two transports.

`AiohttpTransport` is the real one. `MockTransport` answers from a function, so a test can
drive the client's protocol logic without sockets (httpx's ``MockTransport`` habit).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from osmosis_ai._extras import import_optional

__all__ = [
    "KEEPALIVE_SEC",
    "AiohttpTransport",
    "ClientRequest",
    "ClientResponse",
    "MockTransport",
    "Transport",
    "TransportError",
]


#: How long an idle connection is kept for the next request: less than the 5 s after which
#: uvicorn's default (a rollout server started with ``uvicorn.run(app)``) closes one. A
#: request written on a connection as the server closes it gets no answer
#: (``ServerDisconnectedError``), and aiohttp resends only idempotent requests, never a
#: ``POST /rollout``: a training step would stop on it after any pause of about 5 s.
KEEPALIVE_SEC = 3.0


class TransportError(ConnectionError):
    """The request got no HTTP answer (refused, reset, timed out, closed session)."""


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """One request as the client sends it."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes | None = None
    """Encoded JSON, or ``None`` for no body."""
    timeout_sec: float | None = None
    """Bound on the whole exchange; ``None`` = none."""


@dataclass(frozen=True, slots=True)
class ClientResponse:
    """One answer: status, headers (names lower-cased) and the whole body."""

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)

    def header(self, name: str) -> str | None:
        """Header ``name``, case-insensitively."""
        return self.headers.get(name.lower())


class Transport(Protocol):
    """Sends requests; raises `TransportError` when no answer came."""

    async def send(self, request: ClientRequest) -> ClientResponse: ...

    async def aclose(self) -> None: ...


class AiohttpTransport:
    """Requests over aiohttp, whose pool stays cheap with thousands of long polls.

    Args:
        session: An aiohttp ``ClientSession`` to use (never closed here); by default one is
            opened on first use, with ``max_connections`` connections (0 = unlimited), each
            kept idle for at most `KEEPALIVE_SEC`.
    """

    def __init__(self, *, session: Any = None, max_connections: int = 0, feature: str) -> None:
        self._aiohttp = import_optional("aiohttp", extra="server", feature=feature)
        self._session = session
        self._own_session = session is None
        self.max_connections = max_connections

    async def send(self, request: ClientRequest) -> ClientResponse:
        aiohttp = self._aiohttp
        if self._session is None:  # opened lazily: aiohttp wants a running event loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections, keepalive_timeout=KEEPALIVE_SEC
                )
            )
        headers = dict(request.headers)
        if request.body is not None:
            headers["Content-Type"] = "application/json"
        try:
            async with self._session.request(
                request.method,
                request.url,
                data=request.body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=request.timeout_sec),
                allow_redirects=False,
            ) as response:
                body = await response.read()
                answer = {name.lower(): value for name, value in response.headers.items()}
                return ClientResponse(response.status, body, answer)
        except (aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
            # RuntimeError: a session someone else closed under us.
            raise TransportError(type(exc).__name__) from exc

    async def aclose(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None


Handler = Callable[[ClientRequest], ClientResponse | Awaitable[ClientResponse]]


class MockTransport:
    """Answers every request with ``handler(request)`` (sync or async); no sockets.

    The handler may raise `TransportError` to act out an unreachable server.
    """

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    async def send(self, request: ClientRequest) -> ClientResponse:
        answer = self.handler(request)
        if inspect.isawaitable(answer):
            return await answer
        return answer

    async def aclose(self) -> None:
        return None
