"""Byte relays that let a sandbox reach exactly one endpoint: the model gateway.

* ProcessBackend's network-less sandbox: the host listens on a Unix socket inside the
  rollout's private directory and connects each client to the gateway's TCP address;
  inside the sandbox (its own network namespace, only loopback) a relay thread listens on
  ``127.0.0.1`` and connects each client to that socket. The workflow sees an ordinary
  ``http://127.0.0.1:<port>/...`` endpoint.
* Docker on Linux: a gateway bound to the host's loopback is invisible from containers, so
  the host forwards one port on the Docker bridge's address to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable

__all__ = ["serve_gateway_socket", "serve_tcp_forward", "start_loopback_relay"]

_Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
_CHUNK = 65536


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _bridge(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    connect: Callable[[], Awaitable[_Streams]],
) -> None:
    try:
        upstream_reader, upstream_writer = await connect()
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(_pump(reader, upstream_writer), _pump(upstream_reader, writer))
    finally:
        for w in (writer, upstream_writer):
            w.close()
            with contextlib.suppress(OSError):
                await w.wait_closed()


async def serve_gateway_socket(path: str, host: str, port: int) -> asyncio.Server:
    """Host side: accept on the Unix socket ``path``, connect each client to ``host:port``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _bridge(reader, writer, lambda: asyncio.open_connection(host, port))

    return await asyncio.start_unix_server(handle, path=path)


async def serve_tcp_forward(listen_host: str, host: str, port: int) -> asyncio.Server:
    """Accept on ``listen_host`` (an ephemeral port), connect each client to ``host:port``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _bridge(reader, writer, lambda: asyncio.open_connection(host, port))

    return await asyncio.start_server(handle, listen_host, 0)


def start_loopback_relay(socket_path: str) -> int:
    """Sandbox side: relay ``127.0.0.1:<port>`` to ``socket_path`` on a daemon thread.

    The relay has its own event loop, so a workflow that blocks its loop with a synchronous
    HTTP client still reaches the gateway. Returns the port.

    Raises:
        OSError: The relay could not listen.
    """
    ready = threading.Event()
    outcome: list[int | OSError] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _bridge(reader, writer, lambda: asyncio.open_unix_connection(socket_path))

    async def serve() -> None:
        try:
            server = await asyncio.start_server(handle, "127.0.0.1", 0)
        except OSError as exc:
            outcome.append(exc)
            ready.set()
            return
        outcome.append(server.sockets[0].getsockname()[1])
        ready.set()
        await server.serve_forever()

    thread = threading.Thread(
        target=asyncio.run, args=(serve(),), name="osmosis-gateway-relay", daemon=True
    )
    thread.start()
    if not ready.wait(10.0):
        raise OSError("the gateway relay did not start within 10 s")
    result = outcome[0]
    if isinstance(result, OSError):
        raise result
    return result
