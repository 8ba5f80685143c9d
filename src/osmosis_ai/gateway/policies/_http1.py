"""A small keep-alive HTTP/1.1 client for the gateway's calls to an OpenAI-compatible upstream.

Why not aiohttp: its per-request work (URL objects, multidicts, tracing hooks, cookie and
redirect handling) and pool bookkeeping cost as much as the rest of the gateway. In
``benchmarks/gateway.py`` one policy call costs 139–171 µs of CPU through aiohttp and 48–100
µs through this client, and the gateway's CPU per call under 64 clients is halved. An
upstream call needs much less than a general client: POST a JSON body over pooled
keep-alive connections (plain TCP or TLS) and read a Content-Length, chunked or
close-delimited answer, whole or as it streams. Answers are parsed by httptools (llhttp, the
parser uvicorn uses). No proxies from the environment, no cookies, no redirects, no
compression: what the gateway asked of aiohttp before.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import cast
from urllib.parse import SplitResult, unquote, urlsplit

import httptools

__all__ = [
    "Upstream",
    "UpstreamConnectionError",
    "UpstreamResponse",
    "check_base_url",
    "header_line",
]

#: Body bytes held for a slow reader of a streamed answer before the socket stops being read.
_HIGH_WATER = 256 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}
_FORBIDDEN_IN_HEADERS = frozenset("\r\n\0")
_FORBIDDEN_IN_NAMES = _FORBIDDEN_IN_HEADERS | frozenset(": \t")
#: A kept-alive connection lost this soon after a request was written on it, with no byte of
#: answer, was closed by the upstream while idle (the close crossed the request): the request
#: is sent again on a new connection, once. A later loss may mean the upstream worked on it.
_STALE_WINDOW_SEC = 0.1


class UpstreamConnectionError(ConnectionError):
    """The upstream gave no complete HTTP answer: refused, reset, closed early, or not HTTP."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection, carrying one exchange at a time.

    The answer is parsed as bytes arrive; the exchange's reader waits on one future at a
    time. ``stale`` tells a connection the upstream had closed while it sat idle from one
    that failed while the upstream had the request: only the first may be retried.
    """

    def __init__(self, read_timeout_sec: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._read_timeout_sec = read_timeout_sec
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.status = 0
        self.received = False
        self.complete = False
        self._exchanging = False
        self._headers_done = False
        self._informational = False
        self._framed = False
        self._keep_alive = False
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._last_byte_at = 0.0
        self._sent_at = 0.0
        self._lost_after_send: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def reusable(self) -> bool:
        """Whether the last answer ended cleanly on a connection the upstream keeps open."""
        return self.complete and self._keep_alive and not self.closed

    @property
    def stale(self) -> bool:
        """Whether the exchange failed because the upstream had closed the connection while
        it sat idle: lost right after the request was written, with no byte of answer."""
        lost = self._lost_after_send
        return not self.received and lost is not None and lost <= _STALE_WINDOW_SEC

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports (the gateway server's loop) do not subclass asyncio.Transport.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self._exchanging or self.complete:
            self.close()  # bytes nobody asked for: the connection is not safe to reuse
            return
        self.received = True
        self._last_byte_at = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamConnectionError("the upstream switched protocols (101)"))
        except httptools.HttpParserError as exc:
            self._fail(UpstreamConnectionError(f"the upstream's answer is not valid HTTP ({exc})"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self._exchanging or self.complete:
            return
        self._lost_after_send = self._loop.time() - self._sent_at
        if self._headers_done and not self._framed and exc is None and self._error is None:
            self._finish(keep_alive=False)  # a close-delimited body ends with a clean close
            return
        error = UpstreamConnectionError("the upstream closed the connection mid-answer")
        error.__cause__ = exc
        self._fail(error)

    # httptools callbacks. An answer beginning after ours ended (in the same read) was never
    # asked for: the connection is closed and the extra answer ignored.

    def on_message_begin(self) -> None:
        if not self._exchanging:
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        # Framed: the parser knows where the body ends. Otherwise it ends with the connection.
        name = name.lower()
        if name == b"content-length" or (
            name == b"transfer-encoding" and value.rstrip().lower().endswith(b"chunked")
        ):
            self._framed = True

    def on_headers_complete(self) -> None:
        if not self._exchanging:
            return
        status = self._parser.get_status_code()
        if status < 200:  # 100 Continue, 103 Early Hints: the real answer follows
            self._informational = True
            self._framed = False
            return
        self.status = status
        self._headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if not self._exchanging:
            return
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self._transport is not None:
            self._transport.pause_reading()
            self._paused = True
        self._wake()

    def on_message_complete(self) -> None:
        if not self._exchanging:
            return
        if self._informational:
            self._informational = False
            return
        self._finish(keep_alive=self._parser.should_keep_alive())

    # The exchange

    async def send(self, request: bytes) -> None:
        """Send ``request`` and wait for the answer's status line and headers."""
        assert self._transport is not None
        self._exchanging = True
        self._headers_done = self.complete = self.received = self._framed = False
        self.status = 0
        # What a streamed answer's reader left unread (after the last event it wanted).
        self._chunks.clear()
        self._buffered = 0
        self._lost_after_send = None
        self._sent_at = self._last_byte_at = self._loop.time()
        self._timer = self._loop.call_at(
            self._last_byte_at + self._read_timeout_sec, self._check_progress
        )
        self._transport.write(request)
        while not self._headers_done:
            await self._next_event()

    async def body_chunks(self) -> AsyncIterator[bytes]:
        """The answer's body as it arrives (chunked encoding already undone)."""
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._paused and self._buffered <= _HIGH_WATER // 4:
                    self._resume_reading()
                yield chunk
            elif self.complete:
                return
            else:
                await self._next_event()

    async def read(self) -> bytes:
        """The whole body."""
        if not self.complete:  # usually the answer came in the same read as its headers
            return b"".join([chunk async for chunk in self.body_chunks()])
        body = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        return body

    def close(self) -> None:
        """Close the connection; an exchange still running fails."""
        self.closed = True
        self._cancel_timer()
        if self._transport is not None:
            self._transport.close()

    async def _next_event(self) -> None:
        if self._error is not None:
            raise self._error
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _finish(self, *, keep_alive: bool) -> None:
        self.complete = True
        self._keep_alive = keep_alive
        self._exchanging = False
        self._cancel_timer()
        if self._paused:  # the whole answer is in: an idle connection must see a close
            self._resume_reading()
        self._wake()

    def _resume_reading(self) -> None:
        self._paused = False
        # The wait for the next byte counts from now, not from before the pause.
        self._last_byte_at = self._loop.time()
        if self._transport is not None:
            self._transport.resume_reading()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self.close()
        self._wake()

    def _check_progress(self) -> None:
        # One timer per exchange, moved on only when it fires: no timer churn per chunk.
        self._timer = None
        if not self._exchanging:
            return
        now = self._loop.time()
        due = self._last_byte_at + self._read_timeout_sec
        if self._paused:  # we stopped reading, not the upstream stopped sending
            due = now + self._read_timeout_sec
        if due > now:
            self._timer = self._loop.call_at(due, self._check_progress)
            return
        self._fail(TimeoutError(f"no answer from the upstream in {self._read_timeout_sec:g}s"))

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class UpstreamResponse:
    """A streamed answer: its status, then its body as it arrives."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self.status = connection.status

    def chunks(self) -> AsyncIterator[bytes]:
        """The body, piece by piece."""
        return self._connection.body_chunks()

    async def read(self) -> bytes:
        """The rest of the body."""
        return await self._connection.read()


def check_base_url(base_url: str) -> SplitResult:
    """``base_url`` split, if it is an ``http``/``https`` URL with a host, a valid port and
    nothing after its path.

    Raises:
        ValueError: It is not. The message repeats no part of the URL: a mistyped URL may
            hold a key (``https://sk-...@host``, or a credential with an unencoded ``/``).
    """
    parts = urlsplit(base_url)
    if "@" in parts.path or "@" in parts.query or "@" in parts.fragment:
        raise ValueError(
            "it has an '@' after its host: percent-encode '/', '?', '#' and '@' inside "
            "credentials (%2F, %3F, %23, %40)"
        )
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError("it is not an http:// or https:// URL with a host")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError("its port is not a number from 1 to 65535")
    if parts.query or parts.fragment:
        raise ValueError("it has a query or a fragment; drop it")
    return parts


def header_line(name: str, value: str) -> str:
    """``name: value`` and CRLF.

    Raises:
        ValueError: ``name`` is not a header name, or ``value`` holds a line break or NUL
            (the message names the header, never its value).
    """
    if not name or _FORBIDDEN_IN_NAMES.intersection(name):
        raise ValueError(f"{name!r} is not a header name")
    if _FORBIDDEN_IN_HEADERS.intersection(value):
        raise ValueError(f"header {name!r} holds a line break or NUL; it cannot be sent")
    return f"{name}: {value}\r\n"


class Upstream:
    """Pooled keep-alive connections to the origin of ``base_url``, for POSTs of JSON bodies.

    At most ``max_connections`` exchanges run at once (more wait); idle connections are
    reused newest first. A reused connection the upstream had closed while it sat idle (lost
    within ``_STALE_WINDOW_SEC`` of the request, with no byte of answer) is replaced once,
    transparently; any other failure is the caller's, never retried: a POST is not
    idempotent, and the upstream may have begun generating. Use from one event
    loop. Credentials in ``base_url`` (``user:password@``) are sent as Basic auth.

    Raises:
        ValueError: ``base_url`` is not an ``http``/``https`` URL with a host, or a header
            value holds a line break.
    """

    def __init__(
        self,
        base_url: str,
        *,
        max_connections: int,
        connect_timeout_sec: float,
        read_timeout_sec: float,
        headers: Mapping[str, str] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        parts = check_base_url(base_url)
        assert parts.hostname is not None
        self._host = parts.hostname
        self._port = parts.port or _DEFAULT_PORTS[parts.scheme]
        self._path = parts.path.rstrip("/")
        self._tls = (tls or ssl.create_default_context()) if parts.scheme == "https" else None
        host = f"[{self._host}]" if ":" in self._host else self._host
        if parts.port and parts.port != _DEFAULT_PORTS[parts.scheme]:
            host = f"{host}:{parts.port}"
        fixed = {"Host": host, "User-Agent": "osmosis-ai", "Content-Type": "application/json"}
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            fixed["Authorization"] = f"Basic {base64.b64encode(pair.encode()).decode()}"
        fixed.update(headers or {})
        self._fixed_headers = "".join(header_line(k, v) for k, v in fixed.items())
        self._connect_timeout_sec = connect_timeout_sec
        self._read_timeout_sec = read_timeout_sec
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._closed = False

    def request(self, path: str, body: bytes, headers: Mapping[str, str] | None = None) -> bytes:
        """The bytes of a POST of ``body`` (JSON) to ``path``, below the base URL's path.

        Raises:
            ValueError: A header holds a line break or NUL.
        """
        extra = "".join(header_line(k, v) for k, v in headers.items()) if headers else ""
        head = (
            f"POST {self._path}{path} HTTP/1.1\r\n{self._fixed_headers}{extra}"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode("utf-8") + body

    async def post(self, request: bytes) -> tuple[int, bytes]:
        """Send ``request`` (from `request`); the answer's status and whole body."""
        async with self._slots:
            connection = await self._start(request)
            try:
                content = await connection.read()
            except BaseException:
                connection.close()
                raise
            self._release(connection)
            return connection.status, content

    @contextlib.asynccontextmanager
    async def stream(self, request: bytes) -> AsyncIterator[UpstreamResponse]:
        """Send ``request`` (from `request`) and read the answer as it arrives."""
        async with self._slots:
            connection = await self._start(request)
            try:
                yield UpstreamResponse(connection)
            except BaseException:
                connection.close()
                raise
            self._release(connection)

    async def aclose(self) -> None:
        """Close the idle connections; busy ones close when their exchange ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    async def _start(self, request: bytes) -> _Connection:
        """A connection whose answer to ``request`` has begun (status and headers in)."""
        if self._closed:
            raise UpstreamConnectionError("the upstream client is closed")
        while self._idle:
            connection = self._idle.pop()
            if connection.closed:
                continue
            try:
                await connection.send(request)
            except UpstreamConnectionError:
                connection.close()
                if not connection.stale:
                    raise
                break  # sent again once, on a new connection (see _STALE_WINDOW_SEC)
            except BaseException:
                connection.close()
                raise
            return connection
        connection = await self._connect()
        try:
            await connection.send(request)
        except BaseException:
            connection.close()
            raise
        return connection

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        timeout = self._read_timeout_sec
        async with asyncio.timeout(self._connect_timeout_sec):
            _, connection = await loop.create_connection(
                lambda: _Connection(timeout),
                self._host,
                self._port,
                ssl=self._tls,
                server_hostname=self._host if self._tls is not None else None,
            )
        return connection

    def _release(self, connection: _Connection) -> None:
        if connection.reusable and not self._closed:
            self._idle.append(connection)
        else:
            connection.close()
