"""The gateway's upstream HTTP/1.1 client against real servers on 127.0.0.1.

Most servers here are raw asyncio TCP servers that answer byte for byte as each test
scripts them (chunked, close-delimited, slow, broken, closing idle connections), so the
client's framing, pooling and failure handling are pinned against exact wire behaviour.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import ssl
import struct
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway import OpenAICompatiblePolicy
from osmosis_ai.gateway.policies._http1 import Upstream, UpstreamConnectionError, check_base_url
from osmosis_ai.testing import ChatStub

BODY = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()


@dataclass
class Exchange:
    """One request as a raw server read it, and the means to answer it."""

    head: bytes
    body: bytes
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    number: int
    """1 for the first request on its connection, 2 for the next..."""


Handler = Callable[[Exchange], Awaitable[bool]]
"""Answers one exchange; returns whether to keep the connection for another."""


@dataclass
class RawServer:
    port: int
    connections: int = 0
    requests: list[Exchange] = field(default_factory=list)
    open_now: int = 0
    most_open: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, await reader.readexactly(length)


@contextlib.asynccontextmanager
async def raw_server(
    handler: Handler, *, tls: ssl.SSLContext | None = None
) -> AsyncIterator[RawServer]:
    state = RawServer(port=0)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        state.open_now += 1
        state.most_open = max(state.most_open, state.open_now)
        try:
            for number in range(1, 101):
                request = await _read_request(reader)
                if request is None:
                    break
                exchange = Exchange(request[0], request[1], reader, writer, number)
                state.requests.append(exchange)
                if not await handler(exchange):
                    break
        finally:
            state.open_now -= 1
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    state.port = server.sockets[0].getsockname()[1]
    async with server:
        yield state


def _answer(body: bytes, *, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + extra
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


async def _json_answer(exchange: Exchange) -> bool:
    exchange.writer.write(_answer(b'{"ok":true}'))
    return True


def _upstream(url: str, **options: float) -> Upstream:
    settings = {"max_connections": 8, "connect_timeout_sec": 5.0, "read_timeout_sec": 5.0}
    settings.update(options)
    return Upstream(url, **settings)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def _client(url: str, **options: float) -> AsyncIterator[Upstream]:
    upstream = _upstream(url, **options)
    try:
        yield upstream
    finally:
        await upstream.aclose()


async def _failed_post(handler: Handler, match: str) -> RawServer:
    """One call to a server answering with ``handler``, which must fail with ``match``;
    the server, for what it saw."""
    async with raw_server(handler) as server, _client(server.url) as upstream:
        with pytest.raises(UpstreamConnectionError, match=match):
            await _post(upstream)
    return server


async def _post(upstream: Upstream, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    return await upstream.post(upstream.request("/chat/completions", BODY, headers))


async def test_calls_reuse_one_kept_alive_connection_to_a_real_server() -> None:
    async with ChatStub() as stub, _client(stub.base_url) as upstream:
        answers = [await _post(upstream) for _ in range(3)]
    assert [status for status, _ in answers] == [200, 200, 200]
    assert json.loads(answers[0][1])["choices"][0]["message"]["content"] == "echo: hi"
    assert len({request["peer"] for request in stub.requests}) == 1
    assert stub.requests[0]["body"] == json.loads(BODY)


async def test_the_request_carries_path_host_headers_and_body() -> None:
    async with raw_server(_json_answer) as server:
        upstream = Upstream(
            f"http://user:p%40ss@127.0.0.1:{server.port}/base/",
            max_connections=1,
            connect_timeout_sec=5,
            read_timeout_sec=5,
            headers={"X-Fixed": "1"},
        )
        try:
            await _post(upstream, {"X-Session-ID": "rollout-7"})
        finally:
            await upstream.aclose()
    exchange = server.requests[0]
    lines = exchange.head.decode().split("\r\n")
    assert lines[0] == "POST /base/chat/completions HTTP/1.1"
    headers = {
        k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
    }
    assert headers["host"] == f"127.0.0.1:{server.port}"
    assert headers["authorization"] == "Basic " + base64.b64encode(b"user:p@ss").decode()
    assert headers["x-fixed"] == "1"
    assert headers["x-session-id"] == "rollout-7"
    assert headers["content-type"] == "application/json"
    assert exchange.body == BODY


async def test_chunked_and_byte_by_byte_answers_are_read_whole() -> None:
    payload = b'{"choices":[{"message":{"content":"' + b"x" * 5000 + b'"}}]}'

    async def chunked(exchange: Exchange) -> bool:
        exchange.writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for start in range(0, len(payload), 1000):
            piece = payload[start : start + 1000]
            exchange.writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await exchange.writer.drain()
            await asyncio.sleep(0.001)
        exchange.writer.write(b"0\r\n\r\n")
        return True

    async def trickle(exchange: Exchange) -> bool:
        for byte in _answer(b'{"a":1}'):
            exchange.writer.write(bytes([byte]))
            await exchange.writer.drain()
        return True

    for handler, expected in ((chunked, payload), (trickle, b'{"a":1}')):
        async with raw_server(handler) as server, _client(server.url) as upstream:
            first, second = await _post(upstream), await _post(upstream)
        assert first == second == (200, expected)
        assert server.connections == 1  # both framings leave the connection reusable


async def test_a_close_delimited_answer_ends_with_the_connection_and_is_not_reused() -> None:
    async def until_close(exchange: Exchange) -> bool:
        exchange.writer.write(b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"done":')
        await exchange.writer.drain()
        await asyncio.sleep(0.01)
        exchange.writer.write(b"true}")
        return False  # the server closes: that ends the body

    async with raw_server(until_close) as server, _client(server.url) as upstream:
        assert await _post(upstream) == (200, b'{"done":true}')
        assert await _post(upstream) == (200, b'{"done":true}')
    assert server.connections == 2


async def test_error_statuses_come_back_with_their_body() -> None:
    async def overloaded(exchange: Exchange) -> bool:
        body = b'{"error":{"message":"busy"}}'
        exchange.writer.write(
            b"HTTP/1.1 503 Service Unavailable\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        return True

    async with raw_server(overloaded) as server, _client(server.url) as upstream:
        assert await _post(upstream) == (503, b'{"error":{"message":"busy"}}')


async def test_an_informational_answer_before_the_real_one_is_skipped() -> None:
    async def early_hints(exchange: Exchange) -> bool:
        exchange.writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
        await exchange.writer.drain()
        await asyncio.sleep(0.02)  # the client reads the hint on its own
        exchange.writer.write(_answer(b"{}"))
        return True

    async with raw_server(early_hints) as server, _client(server.url) as upstream:
        assert await _post(upstream) == (200, b"{}")
        assert await _post(upstream) == (200, b"{}")
    assert server.connections == 1


async def test_a_connection_the_upstream_closed_while_idle_is_not_reused() -> None:
    async def answer_then_close(exchange: Exchange) -> bool:
        exchange.writer.write(_answer(b"{}"))  # says keep-alive, then closes anyway
        await exchange.writer.drain()
        return False

    async with raw_server(answer_then_close) as server, _client(server.url) as upstream:
        assert await _post(upstream) == (200, b"{}")
        await asyncio.sleep(0.05)  # the close reaches the client while the connection is idle
        assert await _post(upstream) == (200, b"{}")
    assert len(server.requests) == 2
    assert server.connections == 2


async def test_a_kept_alive_connection_closed_before_any_answer_is_retried_on_a_new_one() -> None:
    # The race of an upstream closing an idle connection just as a call reuses it.
    async def one_answer_per_connection(exchange: Exchange) -> bool:
        if exchange.number > 1:
            return False  # closes without a byte of answer
        exchange.writer.write(_answer(b"{}"))
        return True

    async with raw_server(one_answer_per_connection) as server, _client(server.url) as upstream:
        answers = [await _post(upstream) for _ in range(3)]
    assert answers == [(200, b"{}")] * 3
    assert server.connections == 3
    assert [exchange.number for exchange in server.requests] == [1, 2, 1, 2, 1]


async def test_a_failure_mid_answer_is_raised_and_not_retried() -> None:
    async def half(exchange: Exchange) -> bool:
        exchange.writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial"')
        await exchange.writer.drain()
        return False

    server = await _failed_post(half, "mid-answer")
    assert len(server.requests) == 1


async def test_an_answer_that_is_not_http_is_an_error() -> None:
    async def garbage(exchange: Exchange) -> bool:
        exchange.writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        return True

    await _failed_post(garbage, "not valid HTTP")


async def test_read_timeout_bounds_the_wait_for_each_byte_not_the_whole_answer() -> None:
    async def silent(exchange: Exchange) -> bool:
        await asyncio.sleep(5)
        return False

    async def slow_but_steady(exchange: Exchange) -> bool:
        exchange.writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(6):  # 0.36 s in all, never 0.2 s without a byte
            await asyncio.sleep(0.06)
            exchange.writer.write(b"1\r\nx\r\n")
            await exchange.writer.drain()
        exchange.writer.write(b"0\r\n\r\n")
        return True

    loop = asyncio.get_running_loop()
    async with raw_server(silent) as server, _client(server.url, read_timeout_sec=0.2) as upstream:
        started = loop.time()
        with pytest.raises(TimeoutError, match="0.2s"):
            await _post(upstream)
        assert 0.15 < loop.time() - started < 2
    async with (
        raw_server(slow_but_steady) as server,
        _client(server.url, read_timeout_sec=0.2) as upstream,
    ):
        assert await _post(upstream) == (200, b"xxxxxx")


async def test_at_most_max_connections_exchanges_run_at_once() -> None:
    async def slow(exchange: Exchange) -> bool:
        await asyncio.sleep(0.05)
        exchange.writer.write(_answer(b"{}"))
        return True

    async with raw_server(slow) as server, _client(server.url, max_connections=2) as upstream:
        answers = await asyncio.gather(*(_post(upstream) for _ in range(6)))
    assert answers == [(200, b"{}")] * 6
    assert server.most_open == 2
    assert server.connections == 2


async def test_a_streamed_answer_arrives_piece_by_piece_and_a_slow_reader_holds_it_back() -> None:
    first_seen = asyncio.Event()
    big = b"y" * (2 * 1024 * 1024)

    async def stream(exchange: Exchange) -> bool:
        exchange.writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n"
        )
        await exchange.writer.drain()
        await asyncio.wait_for(first_seen.wait(), 5)  # the client saw it before the rest exists
        for start in range(0, len(big), 65536):
            piece = big[start : start + 65536]
            exchange.writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await exchange.writer.drain()
        exchange.writer.write(b"0\r\n\r\n")
        return True

    async with raw_server(stream) as server:
        upstream = _upstream(server.url)
        received: list[bytes] = []
        most_buffered = 0
        try:
            async with upstream.stream(upstream.request("/chat/completions", BODY)) as response:
                assert response.status == 200
                async for chunk in response.chunks():
                    received.append(chunk)
                    if chunk == b"first":
                        first_seen.set()
                    most_buffered = max(most_buffered, response._connection._buffered)
                    await asyncio.sleep(0.005)  # far slower than the server: reading pauses
        finally:
            await upstream.aclose()
    assert received[0] == b"first"
    assert b"".join(received[1:]) == big
    # Without pausing, the whole 2 MiB would wait in memory for the reader.
    assert most_buffered < 1024 * 1024


async def test_cancelling_a_call_closes_its_connection_and_frees_its_slot() -> None:
    async def never(exchange: Exchange) -> bool:
        await asyncio.sleep(5)
        return False

    async with raw_server(never) as server, _client(server.url, max_connections=1) as upstream:
        call = asyncio.create_task(_post(upstream))
        await asyncio.sleep(0.1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert not upstream._idle
        # The only slot is free again: a second call gets through to the server.
        second = asyncio.create_task(_post(upstream))
        for _ in range(100):
            if len(server.requests) == 2:
                break
            await asyncio.sleep(0.01)
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
    assert len(server.requests) == 2
    assert server.connections == 2


async def test_closing_the_client_closes_its_idle_connections() -> None:
    async with raw_server(_json_answer) as server:
        upstream = _upstream(server.url)
        await _post(upstream)
        assert server.open_now == 1
        await upstream.aclose()
        for _ in range(100):
            if server.open_now == 0:
                break
            await asyncio.sleep(0.01)
        assert server.open_now == 0
        with pytest.raises(UpstreamConnectionError, match="closed"):
            await _post(upstream)


def test_header_values_with_line_breaks_are_refused() -> None:
    upstream = _upstream("http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="line break"):
        upstream.request("/chat/completions", BODY, {"X-Session-ID": "a\r\nInjected: 1"})
    with pytest.raises(ValueError, match="line break"):
        _upstream("http://127.0.0.1:9/v1").request("/x", BODY, {"X-A": "nul\0"})


@pytest.mark.parametrize(
    "url",
    [
        "ftp://host/v1",
        "127.0.0.1:8000/v1",
        "http:///v1",
        "http://host/v1?x=1",
        "http://h/v1#f",
        "http://h:0/v1",
        "http://h:99999/v1",
        "http://h:port/v1",
    ],
)
def test_base_urls_that_cannot_be_served_are_config_errors(url: str) -> None:
    with pytest.raises(ValueError):
        check_base_url(url)
    with pytest.raises(ConfigError, match="policy base URL"):
        OpenAICompatiblePolicy(url)


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("http://user:hunter2@host/v1?x=1", "hunter2"),
        # Unencoded '/', '#' or '?' inside a credential: urlsplit ends the host part there,
        # so the secret's head would pass for a host, a port or a scheme.
        ("http://user:s3cr/et@host/v1", "s3cr"),
        ("https://sk-live-abc#123@api.example.com/v1", "sk-live-abc"),
        ("https://sk-live-abc?123@api.example.com/v1", "sk-live-abc"),
        ("https://sk-abc/def@host/v1", "sk-abc"),
        ("sk-abc:def@host/v1", "sk-abc"),
    ],
)
def test_a_bad_url_error_never_repeats_its_credentials(url: str, secret: str) -> None:
    with pytest.raises(ConfigError) as caught:
        OpenAICompatiblePolicy(url)
    assert secret not in str(caught.value)


def _self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return cert, key


async def test_https_upstreams_are_verified_against_the_trust_store(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    async with raw_server(_json_answer, tls=served) as server:
        url = f"https://127.0.0.1:{server.port}/v1"
        default = _upstream(url)  # the system trust store does not know this certificate
        try:
            with pytest.raises(ssl.SSLCertVerificationError):
                await _post(default)
        finally:
            await default.aclose()
        trusting = Upstream(
            url,
            max_connections=2,
            connect_timeout_sec=5,
            read_timeout_sec=5,
            tls=ssl.create_default_context(cafile=str(cert)),
        )
        try:
            assert await _post(trusting) == (200, b'{"ok":true}')
            assert await _post(trusting) == (200, b'{"ok":true}')
        finally:
            await trusting.aclose()
    assert server.connections == 1  # the refused handshake never reached it; one kept alive


async def test_a_stream_left_unread_after_its_end_does_not_leak_into_the_next_call() -> None:
    async def sse(exchange: Exchange) -> bool:
        if exchange.number == 1:
            events = b"data: one\n\ndata: [DONE]\n\n"
            exchange.writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                + f"{len(events):x}\r\n".encode()
                + events
                + b"\r\n5\r\ntrail\r\n0\r\n\r\n"
            )
        else:
            exchange.writer.write(_answer(b'{"second":true}'))
        return True

    async with raw_server(sse) as server, _client(server.url) as upstream:
        async with upstream.stream(upstream.request("/chat/completions", BODY)) as response:
            async for chunk in response.chunks():
                assert b"[DONE]" in chunk
                break  # the reader stops at the event it wanted; "trail" stays unread
        assert await _post(upstream) == (200, b'{"second":true}')
    assert server.connections == 1


async def test_an_answer_nobody_asked_for_closes_the_connection() -> None:
    async def two_answers(exchange: Exchange) -> bool:
        exchange.writer.write(_answer(b'{"asked":true}') + _answer(b'{"extra":true}'))
        return True

    async with raw_server(two_answers) as server, _client(server.url) as upstream:
        assert await _post(upstream) == (200, b'{"asked":true}')
        assert await _post(upstream) == (200, b'{"asked":true}')
    assert server.connections == 2  # the first connection was not trusted again


async def test_a_post_the_upstream_may_have_worked_on_is_never_sent_again() -> None:
    # Four kept-alive connections; then the upstream reads each request, works on it and
    # drops the connection without answering (an engine crash, a proxy's timeout).
    async def answer_then_drop(exchange: Exchange) -> bool:
        if exchange.number == 1:
            await asyncio.sleep(0.05)  # keeps the four first calls concurrent
            exchange.writer.write(_answer(b"{}"))
            return True
        await asyncio.sleep(0.3)
        return False

    async with raw_server(answer_then_drop) as server, _client(server.url) as upstream:
        await asyncio.gather(*(_post(upstream) for _ in range(4)))
        assert len(upstream._idle) == 4
        with pytest.raises(UpstreamConnectionError, match="mid-answer"):
            await _post(upstream)
    assert len(server.requests) == 5  # four first calls, and the failed one exactly once


async def test_a_kept_alive_close_is_retried_once_only() -> None:
    # Every reused connection is found closed: one retry, on a new connection, that works.
    async def one_answer_per_connection(exchange: Exchange) -> bool:
        if exchange.number > 1:
            return False
        await asyncio.sleep(0.05)
        exchange.writer.write(_answer(b"{}"))
        return True

    async with raw_server(one_answer_per_connection) as server, _client(server.url) as upstream:
        await asyncio.gather(*(_post(upstream) for _ in range(4)))
        assert await _post(upstream) == (200, b"{}")
    assert [exchange.number for exchange in server.requests[4:]] == [2, 1]


async def test_a_close_delimited_body_cut_by_a_reset_is_an_error() -> None:
    async def reset(exchange: Exchange) -> bool:
        exchange.writer.write(b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"partial":')
        await exchange.writer.drain()
        await asyncio.sleep(0.02)
        sock = exchange.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        exchange.writer.transport.abort()  # RST, not a clean close
        return False

    await _failed_post(reset, "mid-answer")


async def test_a_timeout_on_a_close_delimited_stream_is_raised_to_a_busy_reader() -> None:
    async def one_event_then_stall(exchange: Exchange) -> bool:
        exchange.writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\ndata: one\n\n")
        await exchange.writer.drain()
        await asyncio.sleep(2)
        return False

    async with (
        raw_server(one_event_then_stall) as server,
        _client(server.url, read_timeout_sec=0.2) as upstream,
    ):
        received: list[bytes] = []
        with pytest.raises(TimeoutError):
            async with upstream.stream(upstream.request("/chat/completions", BODY)) as response:
                async for chunk in response.chunks():
                    received.append(chunk)
                    await asyncio.sleep(0.5)  # busy when the timeout fires
    assert received == [b"data: one\n\n"]


async def test_odd_framings_are_read_or_refused_cleanly() -> None:
    async def identity(exchange: Exchange) -> bool:
        # A transfer coding other than chunked, no length: the body ends with the connection.
        exchange.writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\n{}")
        return False

    async def upgrade(exchange: Exchange) -> bool:
        exchange.writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
        )
        return True

    async with raw_server(identity) as server, _client(server.url) as upstream:
        assert await _post(upstream) == (200, b"{}")
    await _failed_post(upgrade, "switched protocols")
