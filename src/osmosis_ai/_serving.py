"""Running an ASGI app with uvicorn inside the current event loop, on a pre-bound socket."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Self

from osmosis_ai._context_exit import AsyncUnconditionalExit
from osmosis_ai._extras import import_optional

__all__ = [
    "HEADER_TIMEOUT_SEC",
    "RunningServer",
    "ServedApp",
    "bind_socket",
    "bound_header_time",
    "bound_header_time_in_lifespan",
    "free_port",
    "is_loopback_host",
    "new_token",
    "running_server",
]

_STARTUP_TIMEOUT_SEC = 60.0
#: How long a connection may take to send a request's headers. uvicorn has no such bound:
#: a client that trickles a header (or sends half of one) would hold the connection forever.
HEADER_TIMEOUT_SEC = 10.0


def _with_header_deadline(protocol_class: type[Any], seconds: float) -> type[Any]:
    """A subclass of a uvicorn HTTP protocol that closes connections slow to send headers.

    Both uvicorn protocols (h11, httptools) set ``self.cycle`` once a request's headers are
    parsed, and mark it ``response_complete`` when answered; between the two the app owns
    the connection, otherwise the connection is waiting for headers.
    """
    if getattr(protocol_class, "header_timeout_sec", None) is not None:
        return protocol_class  # already bounded

    class HeaderDeadline(protocol_class):  # type: ignore[misc]
        header_timeout_sec = seconds
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and self._awaiting_headers():
                self._arm_header_timer()  # the first bytes of a keep-alive request
            super().data_received(data)
            if self._header_timer is not None and not self._awaiting_headers():
                self._header_timer.cancel()
                self._header_timer = None

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

        def _awaiting_headers(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is None or bool(cycle.response_complete)

        def _arm_header_timer(self) -> None:
            self._header_timer = self.loop.call_later(seconds, self._header_deadline_passed)

        def _header_deadline_passed(self) -> None:
            self._header_timer = None
            if self._awaiting_headers() and not self.transport.is_closing():
                self.transport.close()

    HeaderDeadline.__name__ = f"HeaderDeadline{protocol_class.__name__}"
    return HeaderDeadline


def bound_header_time(config: Any, seconds: float = HEADER_TIMEOUT_SEC) -> None:
    """Make the server of a loaded ``uvicorn.Config`` close a connection whose request
    headers have not all arrived ``seconds`` after its first byte (or its opening)."""
    config.http_protocol_class = _with_header_deadline(config.http_protocol_class, seconds)


def bound_header_time_in_lifespan(receive: Any, seconds: float = HEADER_TIMEOUT_SEC) -> None:
    """`bound_header_time` for an app users serve themselves with ``uvicorn.run(app)``.

    Called from the app's lifespan startup: uvicorn's ``receive`` there is a method of its
    lifespan object, which holds the config, and uvicorn builds each connection's protocol
    from ``config.http_protocol_class`` after startup. Under another server nothing changes.
    """
    config = getattr(getattr(receive, "__self__", None), "config", None)
    if isinstance(getattr(config, "http_protocol_class", None), type):
        bound_header_time(config, seconds)


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket; ``port=0`` picks a free port atomically (no pick-then-bind race)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on accepted
    # sockets whose proto is IPPROTO_TCP, and with it on, an answer written as headers then
    # body waits for the client's delayed ACK: 40 ms per request on a kept-alive connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def free_port() -> int:
    """A loopback port free now, for a child process to bind (another process may take it
    first: the caller retries or fails naming the port)."""
    probe = bind_socket()
    try:
        return int(probe.getsockname()[1])
    finally:
        probe.close()


def new_token() -> str:
    """A random bearer token for a server that must not be open to whoever reaches it."""
    return secrets.token_urlsafe(32)


def is_loopback_host(host: str) -> bool:
    """Whether binding ``host`` serves only this machine (``localhost``, 127/8, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name other than localhost, or "" (every interface)
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


@dataclass(frozen=True)
class RunningServer:
    """A server started by `running_server`."""

    host: str
    port: int

    @property
    def base_url(self) -> str:
        """``http://<host>:<port>``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@contextlib.asynccontextmanager
async def running_server(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    timeout_keep_alive: int = 75,
) -> AsyncIterator[RunningServer]:
    """Serve ``app`` with uvicorn on this loop until the block exits, then shut down cleanly.

    The app's lifespan runs before the block is entered. Signals are left to the caller:
    this server installs no handlers, so it can run inside a CLI or a test.

    Raises:
        RuntimeError: The server did not start (the app's startup failed).
    """
    uvicorn = import_optional("uvicorn", extra="server", feature="Serving over HTTP")

    class _Server(uvicorn.Server):  # type: ignore[misc,name-defined]
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            # uvicorn ends the process (sys.exit) when the app's startup fails; a SystemExit
            # escaping a task would stop our caller's event loop, so this server just stops.
            try:
                await super().startup(sockets=sockets)
            except SystemExit:
                self.should_exit = True

    sock = bind_socket(host, port)
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_keep_alive=timeout_keep_alive,
    )
    config.load()
    bound_header_time(config)
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(_STARTUP_TIMEOUT_SEC):
            while not server.started:
                if task.done():
                    break
                await asyncio.sleep(0.01)
        if not server.started:
            raise RuntimeError("the server failed to start; see the log for the app's error")
        yield RunningServer(host=host, port=sock.getsockname()[1])
    finally:
        server.should_exit = True
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        finally:
            sock.close()


class ServedApp(AsyncUnconditionalExit):
    """Base of objects that serve an ASGI ``app`` while used as an async context manager."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self.host = host
        self.port = port
        self._server: RunningServer | None = None
        self._stack = contextlib.AsyncExitStack()

    @property
    def served_url(self) -> str:
        """``http://host:port`` while serving."""
        if self._server is None:
            name = type(self).__name__
            raise RuntimeError(f"{name} is not running; use it as 'async with {name}(...)'")
        return self._server.base_url

    async def __aenter__(self) -> Self:
        self._server = await self._stack.enter_async_context(
            running_server(self.app, host=self.host, port=self.port)
        )
        return self

    async def _aexit(self) -> None:
        await self._stack.aclose()
        self._server = None
