"""The transports `ModelConnectionPool` lends, in a module of their own: it imports ``httpx2``
(the HTTP library of the ``openai`` SDK the integrations use), which a host that never runs
an integration need not load."""

from __future__ import annotations

import ssl
from collections.abc import Callable

import httpx2

__all__ = ["LentTransport"]


class LentTransport(httpx2.AsyncBaseTransport):
    """A small connection pool lent to one client at a time.

    When the client closes it, it goes back to its lender (``give_back``) with its idle
    connection, instead of closing it.
    """

    def __init__(self, verify: ssl.SSLContext, give_back: Callable[[LentTransport], bool]) -> None:
        self._pool = httpx2.AsyncHTTPTransport(verify=verify)
        self._give_back = give_back

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return await self._pool.handle_async_request(request)

    async def aclose(self) -> None:
        if not self._give_back(self):
            await self.close_connections()

    async def close_connections(self) -> None:
        """Close this transport's connections (the lender's call, or when it is not kept)."""
        await self._pool.aclose()
