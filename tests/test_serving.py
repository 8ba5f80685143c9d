"""Serving over HTTP: connections slow to send their headers are closed."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import httpx2
import pytest

from osmosis_ai._serving import HEADER_TIMEOUT_SEC, bind_socket, running_server
from osmosis_ai.gateway import Gateway
from osmosis_ai.gateway.policies.openai_compatible import OpenAICompatiblePolicy
from osmosis_ai.testing import ChatStub


async def seconds_until_closed_after_partial_headers(port: int) -> float:
    """Send half a request's headers, then nothing; how long until the server hangs up."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /rollout HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: app")
        await writer.drain()
        started = time.monotonic()
        async with asyncio.timeout(HEADER_TIMEOUT_SEC + 10):
            while await reader.read(65536):  # until EOF: the server closed the connection
                pass
        return time.monotonic() - started
    finally:
        writer.close()


@pytest.mark.slow
async def test_gateway_closes_a_connection_that_never_finishes_its_headers() -> None:
    async with ChatStub() as stub, Gateway(OpenAICompatiblePolicy(stub.base_url)) as gateway:
        port = int(gateway.base_url.rsplit(":", 1)[1])
        elapsed = await seconds_until_closed_after_partial_headers(port)
        assert HEADER_TIMEOUT_SEC - 1 <= elapsed <= HEADER_TIMEOUT_SEC + 5
        async with httpx2.AsyncClient(base_url=gateway.base_url) as http:
            assert (await http.get("/health")).status_code == 200


async def _get_health(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
    """``GET /health`` on a kept-alive connection; the answer's head, lower-cased (its body
    is read and dropped)."""
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    async with asyncio.timeout(10):
        head = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
        await reader.readexactly(int(head.split("content-length:")[1].split("\r\n")[0]))
    return head


@pytest.mark.slow
async def test_kept_alive_connections_are_not_cut_by_the_header_bound() -> None:
    # Only header time is bounded: a connection idle between requests past the bound works.
    async with ChatStub() as stub, Gateway(OpenAICompatiblePolicy(stub.base_url)) as gateway:
        host, port = gateway.base_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for attempt in range(3):
                if attempt:
                    await asyncio.sleep(HEADER_TIMEOUT_SEC * 0.6)
                assert (await _get_health(reader, writer)).startswith("http/1.1 200")
        finally:
            writer.close()


async def _failing_startup_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "lifespan"
    await receive()  # lifespan.startup
    await send({"type": "lifespan.startup.failed", "message": "no database"})


async def test_a_failed_startup_is_a_runtime_error_and_frees_the_port() -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(RuntimeError, match="failed to start"):
        async with running_server(_failing_startup_app, port=port):
            pytest.fail("the block must not run when the app's startup failed")
    socket.create_server(("127.0.0.1", port)).close()  # the server's socket was closed


@pytest.mark.slow
async def test_a_slow_header_on_a_busy_connection_gets_the_whole_bound() -> None:
    # A request that starts well into a kept-alive connection's life gets the full bound
    # from its own first bytes (not from the connection's or an earlier request's), then
    # the connection is closed.
    async with ChatStub() as stub, Gateway(OpenAICompatiblePolicy(stub.base_url)) as gateway:
        host, port = gateway.base_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            await _get_health(reader, writer)
            await asyncio.sleep(HEADER_TIMEOUT_SEC * 0.6)
            writer.write(b"GET /health HTTP/1.1\r\nHost: x")
            await writer.drain()
            started = time.monotonic()
            async with asyncio.timeout(HEADER_TIMEOUT_SEC + 10):
                while await reader.read(65536):  # until EOF: the server closed the connection
                    pass
            elapsed = time.monotonic() - started
            assert HEADER_TIMEOUT_SEC - 1 <= elapsed <= HEADER_TIMEOUT_SEC + 5
        finally:
            writer.close()


async def test_connections_accepted_on_a_bound_socket_send_without_nagles_delay() -> None:
    # With Nagle's algorithm on, an answer written as headers then body waits for the
    # client's delayed ACK: 40 ms per request on a kept-alive connection.
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(on_connect, sock=bind_socket())
    async with server:
        host, port = server.sockets[0].getsockname()[:2]
        _, writer = await asyncio.open_connection(host, port)
        async with asyncio.timeout(10):
            assert await accepted != 0
        writer.close()
