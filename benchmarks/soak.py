"""A long run through one rollout server: does its cost per rollout stay flat with history?

Run with ``python benchmarks/soak.py`` (``make bench-soak``): 100,000 no-op rollouts at 512
concurrent through one server in its own process (uvicorn, as a user's entry point runs
it), driven by a plain aiohttp protocol load (admission, then long polls under the lease
until the final result). Per 10,000-rollout slice it prints the server's RSS, its CPU per
rollout, the throughput, its open file descriptors and what ``/health`` says it retains;
then the two targets: RSS at the end within 15 MB of RSS after the first slice, and server
CPU per rollout in the last slice within 5 % of the first. ``--rollouts N`` runs a shorter
soak (slices stay 10,000 unless ``--slice`` says otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp

from _server_process import rollout_server
from osmosis_ai.rollout.types import POLLING_LEASE_HEADER

PROMPT = [{"role": "user", "content": "hi"}]
TERMINAL = frozenset({"success", "failure", "cancelled"})
RSS_TARGET_MB = 15.0
CPU_TARGET = 0.05
_RETRY_SEC = 0.05


@dataclass(frozen=True)
class Slice:
    """The server's figures when ``done`` rollouts had completed."""

    done: int
    wall_sec: float
    cpu_sec: float
    rss_mb: float
    fds: int
    retention: dict[str, Any]


def _cpu_sec(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


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


async def _soak(
    url: str, pid: int, rollouts: int, concurrency: int, slice_size: int, max_sec: float
) -> tuple[list[Slice], int]:
    slices: list[Slice] = []
    failures = 0
    started_ids = 0
    done = 0
    connector = aiohttp.TCPConnector(limit=concurrency + 8)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await _wait_ready(session, url)
        measuring = asyncio.Lock()

        async def record() -> None:
            health = await _health(session, url)
            slices.append(
                Slice(
                    done=done,
                    wall_sec=time.perf_counter(),
                    cpu_sec=_cpu_sec(pid),
                    rss_mb=_rss_mb(pid),
                    fds=len(os.listdir(f"/proc/{pid}/fd")),
                    retention=health.get("retention", {}),
                )
            )

        async def worker() -> None:
            nonlocal started_ids, done, failures
            while started_ids < rollouts:
                started_ids += 1
                if not await _rollout(session, url, f"soak-{started_ids}"):
                    failures += 1
                done += 1
                if done % slice_size == 0 or done == rollouts:
                    async with measuring:
                        await record()

        await record()
        async with asyncio.timeout(max_sec):
            await asyncio.gather(*(worker() for _ in range(concurrency)))
    return slices, failures


def _print(slices: list[Slice], failures: int, disk: tuple[int, int], rollouts: int) -> bool:
    """Print the table and the verdicts; whether every target was met."""
    print(
        f"\n{'rollouts':>9} {'RSS MB':>8} {'CPU ms/rollout':>15} {'rollouts/s':>11} {'fds':>5}"
        f" {'results':>8} {'tombstones':>11}"
    )
    rows = []
    for before, after in zip(slices, slices[1:], strict=False):
        count = after.done - before.done
        cpu_ms = (after.cpu_sec - before.cpu_sec) * 1000 / count
        per_sec = count / (after.wall_sec - before.wall_sec)
        rows.append((after, cpu_ms))
        retained = after.retention.get("results", "-")
        tombstones = after.retention.get("tombstones", "-")
        print(
            f"{after.done:>9,} {after.rss_mb:>8.1f} {cpu_ms:>15.3f} {per_sec:>11.0f} "
            f"{after.fds:>5} {retained!s:>8} {tombstones!s:>11}"
        )
    allocated, entries = disk
    print(f"\nfailed rollouts: {failures}")
    print(
        f"disk: {allocated / rollouts / 1024:.1f} KiB allocated per rollout "
        f"({entries / rollouts:.2f} files and folders per rollout)"
    )
    if len(rows) < 2:
        return failures == 0
    (first, first_cpu), (last, last_cpu) = rows[0], rows[-1]
    rss_growth = last.rss_mb - first.rss_mb
    cpu_change = last_cpu / first_cpu - 1
    rss_ok = rss_growth <= RSS_TARGET_MB
    cpu_ok = cpu_change <= CPU_TARGET
    print(
        f"RSS end - RSS after first slice: {rss_growth:+.1f} MB "
        f"(target <= {RSS_TARGET_MB:g} MB): {'meets target' if rss_ok else 'MISSES target'}"
    )
    print(
        f"CPU per rollout, last slice vs first: {cpu_change:+.1%} "
        f"(target <= +{CPU_TARGET:.0%}): {'meets target' if cpu_ok else 'MISSES target'}"
    )
    return failures == 0 and rss_ok and cpu_ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--slice", type=int, default=10_000, dest="slice_size")
    parser.add_argument("--max-minutes", type=float, default=30.0)
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
            slices, failures = asyncio.run(
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
        ok = _print(slices, failures, _disk_bytes(Path(root)), args.rollouts)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
