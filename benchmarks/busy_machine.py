"""The calculator demo on a machine other work keeps busy: ``make demo``'s evaluation (24
rollouts on the embedded model), idle and beside one process spinning on a core, with the
default compute threads and with one per core.

Run with ``python benchmarks/busy_machine.py`` on an otherwise idle machine (about 4 minutes
on 2 cores). The target: beside the busy process, the default threads take at most twice
their idle time (a user's laptop is never idle; threads that spin while they wait for each
other stall when one of them is descheduled, see docs/gateway.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _proc import busy_processes
from _report import Figure, print_table

CALCULATOR = Path(__file__).resolve().parents[1] / "examples" / "calculator"
OSMOSIS = str(Path(sys.executable).with_name("osmosis"))
#: A whole demo's limit: the slowest measured (every core, beside a busy process) took 75 s.
LIMIT_SEC = 900


def _demo_seconds(threads: str | None, output: Path) -> float:
    """Wall seconds of the demo's evaluation from the start (``--fresh``); ``threads`` is
    ``OMP_NUM_THREADS`` (None: unset, the user's default)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    command = [OSMOSIS, "eval", "run", "configs/eval/calculator.toml", "--fresh", "--strict"]
    started = time.perf_counter()
    done = subprocess.run(
        [*command, "-o", str(output)],
        cwd=CALCULATOR,
        env=env,
        capture_output=True,
        text=True,
        timeout=LIMIT_SEC,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"the demo failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr}")
    return elapsed


def main() -> None:
    cores = len(os.sched_getaffinity(0))
    print(f"osmosis_ai busy-machine benchmark — {cores} cores")
    figures = []
    with tempfile.TemporaryDirectory(prefix="osmosis-busy-") as scratch:
        output = Path(scratch)
        for label, threads in (("default threads", None), (f"{cores} threads", str(cores))):
            idle = _demo_seconds(threads, output)
            with busy_processes(1):
                busy = _demo_seconds(threads, output)
            target = 2.0 if threads is None else None
            figures += [
                Figure(f"{label}, idle", idle, "s"),
                Figure(f"{label}, beside one busy process", busy, "s"),
                Figure(f"{label}, busy / idle", busy / idle, "×", target=target, digits=2),
            ]
    print_table("make demo's evaluation (24 rollouts, embedded model)", figures)


if __name__ == "__main__":
    main()
