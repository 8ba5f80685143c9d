"""Running an ASGI app with uvicorn inside the current event loop, on a pre-bound socket."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError

__all__ = ["RunningServer", "ServedApp", "bind_socket", "running_server"]

_STARTUP_TIMEOUT_SEC = 60.0


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket; ``port=0`` picks a free port atomically (no pick-then-bind race).

    Raises:
        ConfigError: The address cannot be bound (port in use or privileged, unknown host);
            the message names the address and the fix.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise ConfigError(
            f"cannot listen on {address} ({exc.strerror or exc}); pass another port, "
            "or port 0 for a free one"
        ) from None
    sock.setblocking(False)
    return sock


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

    sock = bind_socket(host, port)
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_keep_alive=timeout_keep_alive,
    )
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
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sock.close()


class ServedApp:
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

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.aclose()
        self._server = None
