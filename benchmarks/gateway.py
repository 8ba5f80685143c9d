"""Model-gateway figures: added latency and throughput in front of an instant upstream, and
the embedded model's load time and generation speed (on 1 thread and on every core, idle and
beside busy processes).

Run with ``python benchmarks/gateway.py``. The stub upstream and the gateway each run in
their own process (``osmosis gateway``), the load generator in this one, all on 127.0.0.1.
Besides latencies and calls/s it prints the gateway process's CPU per call under load (read
from /proc, so the other processes' turns on the cores do not count), and the CPU of one
``OpenAICompatiblePolicy.complete`` against a minimal upstream in this process (the cost of
the policy's upstream client).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import LoadResult, run_load
from _proc import busy_processes, cpu_seconds
from _report import Figure, print_table
from osmosis_ai.gateway import EmbeddedPolicy, OpenAICompatiblePolicy
from osmosis_ai.gateway.request import parse_chat_request

HERE = Path(__file__).resolve().parent
OSMOSIS = str(Path(sys.executable).with_name("osmosis"))
BODY = json.dumps(
    {"model": "stub-model", "messages": [{"role": "user", "content": "What is 6*7?"}]}
).encode()
SEQUENTIAL = 2000
CONCURRENCY = 64
CONCURRENT_REQUESTS = 20_000


@contextmanager
def _process(*argv: str) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def _read_until(process: subprocess.Popen[str], prefix: str) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
        if not line and process.poll() is not None:
            break
    raise RuntimeError(f"child exited before printing {prefix!r}")


async def _measure(
    host: str, port: int, path: str, token: str | None, server_pid: int
) -> tuple[LoadResult, LoadResult, float]:
    """Sequential and concurrent load; the third value is the server process's CPU seconds
    per call under the concurrent load."""
    await run_load(host, port, path, BODY, token=token, concurrency=8, requests=500)  # warm-up
    sequential = await run_load(
        host, port, path, BODY, token=token, concurrency=1, requests=SEQUENTIAL
    )
    cpu_before = cpu_seconds(server_pid)
    loaded = await run_load(
        host, port, path, BODY, token=token, concurrency=CONCURRENCY, requests=CONCURRENT_REQUESTS
    )
    return sequential, loaded, (cpu_seconds(server_pid) - cpu_before) / CONCURRENT_REQUESTS


_ANSWER = json.dumps(
    {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "The answer is 42."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15},
    }
).encode()
POLICY_CALLS = 5000


class _FixedAnswer(asyncio.Protocol):
    """A minimal upstream: answers every request with ``_ANSWER`` (nearly free, so the CPU
    measured around it is the policy's client)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.WriteTransport, transport)
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(_ANSWER), _ANSWER)
            )


async def _policy_call_cpu() -> float:
    """CPU seconds per ``OpenAICompatiblePolicy.complete`` (token data and session header on,
    as the SkyRL adapter uses it), against the minimal upstream in this process."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_FixedAnswer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    policy = OpenAICompatiblePolicy(
        f"http://127.0.0.1:{port}/v1", model="m", token_data=True, session_header="X-Session-ID"
    )
    await policy.start()
    messages = [{"role": "user", "content": "What is 6*7?"}] * 10
    request = parse_chat_request({"messages": messages, "max_tokens": 16})
    try:
        for _ in range(200):  # warm-up: connection open, caches filled
            await policy.complete(request)
        started = time.process_time()
        for _ in range(POLICY_CALLS):
            await policy.complete(request)
        return (time.process_time() - started) / POLICY_CALLS
    finally:
        await policy.aclose()
        server.close()


async def _embedded(n_threads: int | None = None) -> tuple[float, float]:
    """The embedded model's load time and tokens/s of one 256-token answer."""
    policy = EmbeddedPolicy(n_threads=n_threads)
    await policy.start()
    try:
        request = parse_chat_request(
            {
                "messages": [{"role": "user", "content": "Write a long story about a robot."}],
                "max_tokens": 256,
                "temperature": 0,
                "ignore_eos": True,
            }
        )
        await policy.complete(request)  # warm-up
        started = time.perf_counter()
        answer = await policy.complete(request)
        elapsed = time.perf_counter() - started
        assert policy.load_seconds is not None
        return policy.load_seconds, answer["usage"]["completion_tokens"] / elapsed
    finally:
        await policy.aclose()


def _threads_beside_busy_work() -> list[Figure]:
    """tokens/s on 1 thread, the default (one fewer than the cores) and every core: idle,
    beside one busy process, and beside one more than there are cores. llama.cpp's threads
    spin while they wait for each other."""
    cores = len(os.sched_getaffinity(0))
    figures = []
    for busy in (0, 1, cores + 1):
        for threads in sorted({1, max(1, cores - 1), cores}):
            with busy_processes(busy):
                speed = asyncio.run(_embedded(threads))[1]
            where = f"beside {busy} busy process(es)" if busy else "idle"
            figures.append(Figure(f"{threads} thread(s), {where}", speed, "tok/s", digits=1))
    return figures


def main() -> None:
    print(
        f"osmosis_ai gateway benchmarks — python {sys.version.split()[0]}, {os.cpu_count()} cores"
    )
    with _process(sys.executable, str(HERE / "_stub_process.py")) as stub:
        stub_url = _read_until(stub, "")
        with _process(OSMOSIS, "gateway", "--policy", f"openai:{stub_url}", "--port", "0") as gw:
            gateway_url = _read_until(gw, "gateway:").split()[0]
            token = _read_until(gw, "token:")
            stub_parts, gateway_parts = urlsplit(stub_url), urlsplit(gateway_url)
            direct_seq, direct_load, stub_cpu = asyncio.run(
                _measure(
                    stub_parts.hostname or "",
                    stub_parts.port or 0,
                    "/v1/chat/completions",
                    None,
                    stub.pid,
                )
            )
            via_seq, via_load, gateway_cpu = asyncio.run(
                _measure(
                    gateway_parts.hostname or "",
                    gateway_parts.port or 0,
                    "/v1/rollouts/bench/chat/completions",
                    token,
                    gw.pid,
                )
            )
    policy_cpu = asyncio.run(_policy_call_cpu())
    load_sec, tokens_per_sec = asyncio.run(_embedded())
    by_threads = _threads_beside_busy_work()
    ms = 1e3
    print_table(
        "Gateway in front of an instant stub upstream (openai policy)",
        [
            Figure(
                "added latency p50 (1 client)",
                (via_seq.percentile(0.5) - direct_seq.percentile(0.5)) * ms,
                "ms",
                target=1,
            ),
            Figure(
                "added latency p99 (1 client)",
                (via_seq.percentile(0.99) - direct_seq.percentile(0.99)) * ms,
                "ms",
                target=5,
            ),
            Figure(
                f"calls/s through the gateway ({CONCURRENCY} clients)",
                via_load.per_sec,
                "/s",
                target=1500,
                lower_is_better=False,
            ),
            Figure(
                f"calls/s to the stub directly ({CONCURRENCY} clients)", direct_load.per_sec, "/s"
            ),
            Figure(
                f"latency p50 via gateway ({CONCURRENCY} clients)",
                via_load.percentile(0.5) * ms,
                "ms",
            ),
            Figure(
                f"latency p99 via gateway ({CONCURRENCY} clients)",
                via_load.percentile(0.99) * ms,
                "ms",
            ),
            Figure(
                f"latency p50 direct ({CONCURRENCY} clients)",
                direct_load.percentile(0.5) * ms,
                "ms",
            ),
            # The gateway's own work per call (its server, its upstream client, its records),
            # beside the stub's for a whole call: from /proc, so the load generator's and the
            # stub's turns on the cores do not count.
            Figure(
                f"gateway process CPU per call ({CONCURRENCY} clients)",
                gateway_cpu * ms,
                "ms",
                digits=3,
            ),
            Figure(
                f"stub process CPU per call, directly ({CONCURRENCY} clients)",
                stub_cpu * ms,
                "ms",
                digits=3,
            ),
            Figure("failed calls", via_load.errors + via_seq.errors, ""),
        ],
    )
    print_table(
        "OpenAI-compatible policy alone (its upstream client; a minimal upstream in process)",
        [
            Figure(
                f"CPU per policy.complete, 10 messages ({POLICY_CALLS} calls)",
                policy_cpu * 1e6,
                "µs",
                digits=0,
            )
        ],
    )
    print_table(
        "Embedded model (SmolLM2-135M-Instruct, llama.cpp, CPU)",
        [
            Figure("load time", load_sec, "s", target=2),
            Figure(
                "generation speed (256 tokens)",
                tokens_per_sec,
                "tok/s",
                target=50,
                lower_is_better=False,
            ),
        ],
    )
    print_table("Embedded model's generation speed by threads (OMP_NUM_THREADS)", by_threads)


if __name__ == "__main__":
    main()
