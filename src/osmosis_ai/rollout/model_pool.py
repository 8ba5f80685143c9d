"""Connections to the model endpoint that outlive a rollout, reused by a host's next rollouts.

An agent integration gives each rollout its own ``openai`` client, closed when the rollout
ends. With a connection pool of its own per client, every rollout paid for a new TCP
connection (its connect, and the endpoint's accept) and left a socket in ``TIME_WAIT``:
at training scale, thousands a minute. A host that runs many rollouts on one event loop (the
rollout server does) keeps one `ModelConnectionPool` and puts it on each `RolloutContext`:
a rollout's client then borrows a transport with its open connection, and gives it back
when it closes.

Transports are lent whole, one client at a time, rather than one connection pool shared by
all clients: httpx's pool walks all its connections (probing every idle socket) on each
request, which at 512 concurrent rollouts cost more than the connections it saved.
"""

from __future__ import annotations

import functools
import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx2

    from osmosis_ai.rollout._pooled_transport import LentTransport

__all__ = ["ModelConnectionPool", "tls_context"]


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The one TLS context of the process's model clients.

    Building one (loading the CA bundle) costs ~20 ms; every client can share it.
    """
    import httpx2

    return httpx2.create_ssl_context()


class ModelConnectionPool:
    """Transports (each with its open connections) lent to one rollout client at a time.

    Use it from one event loop (connections belong to the loop that opened them). Nothing is
    imported or opened before the first `transport()`. At most ``max_idle`` transports wait
    for a borrower; one given back beyond that is closed, and so is every transport given
    back after `aclose()`. An idle connection the endpoint closed meanwhile is replaced on
    the borrower's first request.
    """

    def __init__(self, max_idle: int = 256) -> None:
        self.max_idle = max_idle
        self._idle: list[LentTransport] = []
        self._closed = False

    def transport(self) -> httpx2.AsyncBaseTransport:
        """A transport for one client, most recently given back first; the client's close
        gives it back."""
        if self._idle:
            return self._idle.pop()
        from osmosis_ai.rollout._pooled_transport import LentTransport

        return LentTransport(tls_context(), self._give_back)

    def _give_back(self, transport: LentTransport) -> bool:
        if self._closed or len(self._idle) >= self.max_idle:
            return False
        self._idle.append(transport)
        return True

    async def aclose(self) -> None:
        """Close the idle transports' connections; transports given back later are closed."""
        self._closed = True
        idle, self._idle = self._idle, []
        for transport in idle:
            await transport.close_connections()
