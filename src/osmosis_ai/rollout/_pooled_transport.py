"""The transports `ModelConnectionPool` lends, in a module of their own: it imports ``httpx2``
(the HTTP library of the ``openai`` SDK the integrations use), which a host that never runs
an integration need not load."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable

import httpx2

__all__ = ["LentTransport"]


class LentTransport(httpx2.AsyncBaseTransport):
    """A small connection pool lent to one client at a time.

    When the client closes it, it goes back to its lender (``give_back``) with its idle
    connections, unless a response is still open (a rollout cancelled in the middle of a
    stream): its connections are closed then, as the client's own pool would have been.
    """

    def __init__(self, verify: ssl.SSLContext, give_back: Callable[[LentTransport], bool]) -> None:
        self._pool = httpx2.AsyncHTTPTransport(verify=verify)
        self._give_back = give_back
        self.open_responses = 0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._pool.handle_async_request(request)
        assert isinstance(response.stream, httpx2.AsyncByteStream)  # an async transport's
        self.open_responses += 1
        response.stream = _CountedStream(response.stream, self)
        return response

    async def aclose(self) -> None:
        if self.open_responses or not self._give_back(self):
            await self.close_connections()

    async def close_connections(self) -> None:
        """Close this transport's connections (the lender's call, or when it is not kept)."""
        await self._pool.aclose()


class _CountedStream(httpx2.AsyncByteStream):
    """A response body that tells its transport when it is closed."""

    def __init__(self, stream: httpx2.AsyncByteStream, transport: LentTransport) -> None:
        self._stream = stream
        self._transport: LentTransport | None = transport

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        if self._transport is not None:
            self._transport.open_responses -= 1
            self._transport = None
        await self._stream.aclose()
