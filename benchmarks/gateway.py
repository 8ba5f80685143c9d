"""Model-gateway figures: added latency and throughput in front of an instant upstream, and
the embedded model's load time and generation speed.

Run with ``python benchmarks/gateway.py``. The stub upstream and the gateway each run in
their own process (``osmosis gateway``), the load generator in this one, all on 127.0.0.1.
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
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import LoadResult, run_load
from _report import Figure, print_table
from osmosis_ai.gateway import EmbeddedPolicy
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
    host: str, port: int, path: str, token: str | None
) -> tuple[LoadResult, LoadResult]:
    await run_load(host, port, path, BODY, token=token, concurrency=8, requests=500)  # warm-up
    sequential = await run_load(
        host, port, path, BODY, token=token, concurrency=1, requests=SEQUENTIAL
    )
    loaded = await run_load(
        host, port, path, BODY, token=token, concurrency=CONCURRENCY, requests=CONCURRENT_REQUESTS
    )
    return sequential, loaded


async def _embedded() -> tuple[float, float]:
    policy = EmbeddedPolicy()
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
            direct_seq, direct_load = asyncio.run(
                _measure(
                    stub_parts.hostname or "", stub_parts.port or 0, "/v1/chat/completions", None
                )
            )
            via_seq, via_load = asyncio.run(
                _measure(
                    gateway_parts.hostname or "",
                    gateway_parts.port or 0,
                    "/v1/rollouts/bench/chat/completions",
                    token,
                )
            )
    load_sec, tokens_per_sec = asyncio.run(_embedded())
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
            Figure("failed calls", via_load.errors + via_seq.errors, ""),
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


if __name__ == "__main__":
    main()
