"""A long run through one rollout server: does its cost per rollout stay flat with history?

Run with ``python benchmarks/soak.py`` (``make bench-soak``): 100,000 no-op rollouts at 512
concurrent through one server in its own process (uvicorn, as a user's entry point runs
it), driven by a plain aiohttp protocol load (admission, then long polls under the lease
until the final result). Per 10,000-rollout slice it prints the server's RSS, its CPU per
rollout and the kernel's part of it (mostly the filesystem: per-rollout folders and files,
whose cost varies with the disk's state), the throughput, its open file descriptors and
what ``/health`` says it retains;
then the two targets: RSS at the end within 15 MB of RSS after the first slice, and the
server's CPU per rollout outside the kernel in the last three slices within 5 % of the first
three, by their means (one slice swings by ±10 % with the machine; the kernel's part, and
the total, are printed beside it: they follow the disk). ``--rollouts N``
runs a shorter soak (slices stay 10,000 unless ``--slice`` says otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp

from _proc import cpu_seconds, kernel_cpu_seconds, rss_mb
from _server_process import rollout_server
from osmosis_ai.rollout.types import POLLING_LEASE_HEADER

PROMPT = [{"role": "user", "content": "hi"}]
TERMINAL = frozenset({"success", "failure", "cancelled"})
RSS_TARGET_MB = 15.0
CPU_TARGET = 0.05
#: Slices at each end of the run whose mean CPU per rollout is compared.
CPU_WINDOW = 3
_RETRY_SEC = 0.05


@dataclass(frozen=True)
class Slice:
    """The server's figures when ``done`` rollouts had completed."""

    done: int
    wall_sec: float
    cpu_sec: float
    kernel_sec: float
    rss_mb: float
    fds: int
    retention: dict[str, Any]


def _disk_bytes(root: Path) -> tuple[int, int]:
    """(bytes allocated on disk, entries) under ``root``, directories included."""
    allocated = entries = 0
    for directory, names, files in os.walk(root):
        for name in (*names, *files):
            allocated += os.lstat(os.path.join(directory, name)).st_blocks * 512
            entries += 1
    return allocated, entries


async def _health(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/health") as response:
        response.raise_for_status()
        health: dict[str, Any] = await response.json()
        return health


async def _wait_ready(session: aiohttp.ClientSession, url: str) -> None:
    async with asyncio.timeout(60):
        while True:
            try:
                await _health(session, url)
                return
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)


async def _rollout(session: aiohttp.ClientSession, url: str, rollout_id: str) -> bool:
    """One rollout through the protocol; whether it succeeded."""
    body = {
        "rollout_id": rollout_id,
        "initial_messages": PROMPT,
        "chat_completions_url": "http://127.0.0.1:9",
        "llm_api_key": "bench-key",
        "grade": False,
    }
    for _ in range(1000):  # 429: the backend is full; admission is retried, briefly
        async with session.post(f"{url}/rollout", json=body) as response:
            if response.status == 429:
                await asyncio.sleep(_RETRY_SEC)
                continue
            if response.status != 202:
                return False
            token = (await response.json())["polling_lease_token"]
            break
    else:
        return False
    headers = {POLLING_LEASE_HEADER: token}
    for _ in range(100):  # a no-op rollout reports at most queued, running, then its end
        async with session.get(f"{url}/rollout/{rollout_id}/result", headers=headers) as answer:
            if answer.status != 200:
                return False
            status = (await answer.json())["status"]
        if status in TERMINAL:
            return bool(status == "success")
    return False


_HEADER = (
    f"{'rollouts':>9} {'RSS MB':>8} {'CPU ms/rollout':>15} {'in kernel':>10}"
    f" {'rollouts/s':>11} {'fds':>5}"
    f" {'results':>8} {'tombstones':>11}"
)


def _cpu_ms(before: Slice, after: Slice) -> float:
    return (after.cpu_sec - before.cpu_sec) * 1000 / (after.done - before.done)


def _kernel_ms(before: Slice, after: Slice) -> float:
    return (after.kernel_sec - before.kernel_sec) * 1000 / (after.done - before.done)


def _user_ms(before: Slice, after: Slice) -> float:
    """CPU per rollout outside the kernel: the server's own code."""
    return _cpu_ms(before, after) - _kernel_ms(before, after)


def _mean_ms(
    pairs: list[tuple[Slice, Slice]], per_rollout: Callable[[Slice, Slice], float]
) -> float:
    return sum(per_rollout(before, after) for before, after in pairs) / len(pairs)


def _print_row(before: Slice, after: Slice) -> None:
    per_sec = (after.done - before.done) / (after.wall_sec - before.wall_sec)
    retained = after.retention.get("results", "-")
    tombstones = after.retention.get("tombstones", "-")
    kernel_ms = _kernel_ms(before, after)
    print(
        f"{after.done:>9,} {after.rss_mb:>8.1f} {_cpu_ms(before, after):>15.3f} "
        f"{kernel_ms:>10.3f} {per_sec:>11.0f} {after.fds:>5} {retained!s:>8} {tombstones!s:>11}",
        flush=True,
    )


@dataclass
class Run:
    """What a soak measured: a slice per ``--slice`` rollouts, failures, and how it ended."""

    slices: list[Slice]
    failures: int = 0
    done: int = 0
    timed_out: bool = False


async def _soak(
    url: str, pid: int, rollouts: int, concurrency: int, slice_size: int, max_sec: float
) -> Run:
    run = Run(slices=[])
    started_ids = 0
    connector = aiohttp.TCPConnector(limit=concurrency + 8)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await _wait_ready(session, url)
        measuring = asyncio.Lock()

        async def record() -> None:
            health = await _health(session, url)
            run.slices.append(
                Slice(
                    done=run.done,
                    wall_sec=time.perf_counter(),
                    cpu_sec=cpu_seconds(pid),
                    kernel_sec=kernel_cpu_seconds(pid),
                    rss_mb=rss_mb(pid),
                    fds=len(os.listdir(f"/proc/{pid}/fd")),
                    retention=health.get("retention", {}),
                )
            )
            if len(run.slices) > 1:
                _print_row(run.slices[-2], run.slices[-1])

        async def worker() -> None:
            nonlocal started_ids
            while started_ids < rollouts:
                started_ids += 1
                if not await _rollout(session, url, f"soak-{started_ids}"):
                    run.failures += 1
                run.done += 1
                if run.done % slice_size == 0 or run.done == rollouts:
                    async with measuring:
                        await record()

        await record()
        print(_HEADER, flush=True)
        try:
            async with asyncio.timeout(max_sec):
                await asyncio.gather(*(worker() for _ in range(concurrency)))
        except TimeoutError:
            run.timed_out = True
    return run


def _verdicts(run: Run, disk: tuple[int, int]) -> bool:
    """Print failures, disk and the two targets; whether the run met them all."""
    allocated, entries = disk
    done = max(1, run.done)
    print(f"\nfailed rollouts: {run.failures}")
    if run.timed_out:
        print(f"STOPPED at the time bound after {run.done:,} rollouts")
    print(
        f"disk: {allocated / done / 1024:.1f} KiB allocated per rollout "
        f"({entries / done:.2f} files and folders per rollout)"
    )
    slices = run.slices
    if len(slices) < 3:
        return run.failures == 0 and not run.timed_out
    rss_growth = slices[-1].rss_mb - slices[1].rss_mb
    # One slice's CPU per rollout swings by ±10 % with the machine: the first and the last
    # few slices are compared, by their means.
    pairs = list(itertools.pairwise(slices))
    window = max(1, min(CPU_WINDOW, len(pairs) // 3))
    head, tail = pairs[:window], pairs[-window:]
    cpu_change = _mean_ms(tail, _cpu_ms) / _mean_ms(head, _cpu_ms) - 1
    # The kernel's part moves with the disk's state (dirty-page writeback of the rollouts'
    # files); the rest is the server's own code, and that is what must stay flat.
    user_first, user_last = _mean_ms(head, _user_ms), _mean_ms(tail, _user_ms)
    user_change = user_last / user_first - 1
    kernel_change = _mean_ms(tail, _kernel_ms) / max(_mean_ms(head, _kernel_ms), 1e-9) - 1
    rss_ok = rss_growth <= RSS_TARGET_MB
    cpu_ok = user_change <= CPU_TARGET
    print(
        f"RSS end - RSS after first slice: {rss_growth:+.1f} MB "
        f"(target <= {RSS_TARGET_MB:g} MB): {'meets target' if rss_ok else 'MISSES target'}"
    )
    print(
        f"CPU per rollout outside the kernel, mean of the last {window} slice(s) vs the first "
        f"{window}: {user_change:+.1%} "
        f"({user_first:.3f} -> {user_last:.3f} ms; target <= +{CPU_TARGET:.0%}): "
        f"{'meets target' if cpu_ok else 'MISSES target'}"
    )
    print(
        f"  for reference, all CPU per rollout: {cpu_change:+.1%}; in the kernel: "
        f"{kernel_change:+.1%} (the disk's share, not the server's code)"
    )
    return run.failures == 0 and not run.timed_out and rss_ok and cpu_ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--slice", type=int, default=10_000, dest="slice_size")
    parser.add_argument("--max-minutes", type=float, default=60.0)
    args = parser.parse_args()
    if args.rollouts < 1 or args.slice_size < 1 or args.concurrency < 1:
        parser.error("--rollouts, --slice and --concurrency must be at least 1")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(
        f"soak: {args.rollouts:,} no-op rollouts at {args.concurrency} concurrent, one server "
        f"(python {sys.version.split()[0]}, {os.cpu_count()} cores)"
    )
    with tempfile.TemporaryDirectory(prefix="osmosis-soak-") as root:
        with rollout_server("noop", root) as (process, url):
            run = asyncio.run(
                _soak(
                    url,
                    process.pid,
                    args.rollouts,
                    args.concurrency,
                    args.slice_size,
                    args.max_minutes * 60,
                )
            )
        # Printed before the temporary root is removed: that takes a while on a busy disk.
        ok = _verdicts(run, _disk_bytes(Path(root)))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
