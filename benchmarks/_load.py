"""A small HTTP/1.1 keep-alive load generator (raw asyncio streams, so it costs little CPU)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

__all__ = ["LoadResult", "run_load"]


@dataclass
class LoadResult:
    """Latencies (seconds) of every completed request, and the wall time of the run."""

    latencies: list[float]
    wall_sec: float
    errors: int

    @property
    def per_sec(self) -> float:
        return len(self.latencies) / self.wall_sec

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _request(host: str, port: int, path: str, body: bytes, token: str | None) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return status


async def run_load(
    url_host: str,
    port: int,
    path: str,
    body: bytes,
    *,
    token: str | None = None,
    concurrency: int,
    requests: int,
    max_seconds: float = 120.0,
) -> LoadResult:
    """Send ``requests`` POSTs over ``concurrency`` keep-alive connections (bounded in time)."""
    payload = _request(url_host, port, path, body, token)
    remaining = requests
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + max_seconds

    async def worker() -> None:
        nonlocal remaining, errors
        reader, writer = await asyncio.open_connection(url_host, port)
        try:
            while remaining > 0 and time.perf_counter() < deadline:
                remaining -= 1
                started = time.perf_counter()
                writer.write(payload)
                status = await _read_response(reader)
                if status == 200:
                    latencies.append(time.perf_counter() - started)
                else:
                    errors += 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return LoadResult(latencies, time.perf_counter() - started, errors)
