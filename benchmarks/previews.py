"""Live-preview cost: CPU share and added completion latency at 1,000 concurrent rollouts.

Run with ``python benchmarks/previews.py``. The same workload runs twice against a rollout
server in its own process (uvicorn, as a user's entry point): previews off, then on (a
preview root set, so every snapshot is also written to disk). Each of the 1,000 concurrent
rollouts grows a previewable history by a 400-character message every 2.5 s for 8 turns
(about 20 s). The preview machinery's CPU share is the difference of the server process's
CPU time between the runs over the run's wall time (noisy on a shared machine), and, more
precisely, the CPU the machinery itself counts (its worker-thread and event-loop time, from
``/health``); the added latency compares the mean time from admission to final result.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _proc import cpu_seconds
from _report import Figure, print_table
from _server_process import rollout_server, wait_ready
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.trajectory.preview import PREVIEW_ROOT_ENV

ROLLOUTS = 1_000
REPEATS = 3
PROMPT = [{"role": "user", "content": "tell me a story"}]


async def _workload(url: str, pid: int) -> dict[str, Any]:
    async with RolloutClient(url=url, max_connections=512) as client:
        await wait_ready(client)
        cpu_before, wall_before = cpu_seconds(pid), time.monotonic()

        async def one(index: int) -> float:
            started = time.monotonic()
            handle = await client.run_rollout(
                PROMPT, "http://127.0.0.1:9/v1", f"p{index}", label="x", grade=False
            )
            result = await handle
            assert result.status.value == "success", result.err_message
            return time.monotonic() - started

        latencies = await asyncio.gather(*(one(index) for index in range(ROLLOUTS)))
        wall = time.monotonic() - wall_before
        cpu = cpu_seconds(pid) - cpu_before
        previews = (await client.health()).get("previews") or {}
    return {
        "latency": statistics.mean(latencies),
        "cpu": cpu,
        "wall": wall,
        "preview_cpu": previews.get("cpu_sec", 0.0),
        "publications": previews.get("publications", 0),
    }


def _run(mode: str) -> dict[str, Any]:
    """One workload with previews ``off``, served over ``http`` only, or also as ``files``."""
    with tempfile.TemporaryDirectory() as root:
        env = {"BENCH_PREVIEWS": mode}
        if mode == "files":
            env[PREVIEW_ROOT_ENV] = str(Path(root) / "previews")
        with rollout_server("talking", root, env) as (process, url):
            figures = asyncio.run(_workload(url, process.pid))
        files = list((Path(root) / "previews").glob("*/preview.json"))
        figures["files"] = len(files)
        sample = json.loads(files[0].read_text()) if files else {}
        figures["final_status"] = sample.get("extra", {}).get("osmosis", {}).get("status")
    return figures


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("cpu", "wall", "latency", "preview_cpu", "publications")
    return {key: statistics.median(run[key] for run in runs) for key in keys}


def _share(run: dict[str, Any], key: str = "cpu") -> float:
    return 100 * float(run[key]) / float(run["wall"])


def main() -> None:
    # Alternate the setups and take medians: a shared 2-core machine is noisy.
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "http": [], "files": []}
    for _ in range(REPEATS):
        for mode, collected in runs.items():
            collected.append(_run(mode))
    off, http, files = (_median_run(runs[mode]) for mode in ("off", "http", "files"))
    figures = [Figure("server CPU, previews off", _share(off), "% core")]
    for label, run in (("over HTTP only", http), ("HTTP and files", files)):
        figures += [
            Figure(f"{label}: server CPU", _share(run), "% core"),
            Figure(f"{label}: preview share (difference)", _share(run) - _share(off), "% core", 10),
            Figure(f"{label}: preview share (counted)", _share(run, "preview_cpu"), "% core", 10),
            Figure(f"{label}: publications", run["publications"] / run["wall"], "/s"),
            Figure(
                f"{label}: added completion latency",
                100 * (run["latency"] - off["latency"]) / off["latency"],
                "%",
                1,
            ),
        ]
    figures.append(Figure("mean completion, previews off", off["latency"], "s"))
    print_table(
        f"{ROLLOUTS:,} concurrent previewed rollouts (server process, median of {REPEATS})", figures
    )
    last = runs["files"][-1]
    print(f"  preview files written: {last['files']}, final status: {last['final_status']}")


if __name__ == "__main__":
    main()
