"""Side by side with the reference SDK (osmosis-ai 0.3.8), measured in one run.

Run with ``make bench-compare`` (or ``python benchmarks/compare_reference.py``). The
reference is installed once into a cached Python 3.12 virtual environment
(``benchmarks/.cache/reference-0.3.8``, git-ignored); ours runs from this interpreter. The
same rollout file (``_compare_server.py``, written against the API both share) is served by
each SDK's own ``create_rollout_server`` in its own process; the same load generator
(``RolloutClient``, speaking the shared protocol) drives both against the same instant stub
model (``_stub_process.py``, its own process). Runs alternate ours/theirs and figures are
medians; when the repeats of one figure spread by more than 30 % the table says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _proc import cpu_seconds, kernel_cpu_seconds, rss_mb
from _server_process import wait_ready
from osmosis_ai._serving import bind_socket
from osmosis_ai.errors import RolloutProtocolError
from osmosis_ai.rollout.client import RolloutClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REFERENCE = "0.3.8"
REFERENCE_VENV = HERE / ".cache" / f"reference-{REFERENCE}"
# pip resolves the reference's Strands extra to a LiteLLM (1.106.12) whose proxy route fails
# to import (`acompletion_with_mcp`); the version our own litellm extra resolves to works.
REFERENCE_PINS = ["litellm==1.110.2"]
PROMPT = [{"role": "user", "content": "hi"}]
REPEATS = 3
WINDOW_SEC = 8.0
WARMUP_TIMEOUT_SEC = 120.0
IDLE_ROLLOUTS = 2000
IMPORT_RUNS = 5
NOISY_SPREAD = 1.3

#: (name, workflow kind, concurrency, documented) of the throughput/latency runs.
#: ``documented``: the backend exactly as the user guide builds it, ``LocalBackend(workflow=
#: ...)``; otherwise with a config that lifts the reference's default cap of 4 rollouts.
LOADS = [
    ("no-op, 64 conc., as documented", "noop", 64, True),
    ("no-op, 64 conc., uncapped", "noop", 64, False),
    ("no-op, 512 conc., uncapped", "noop", 512, False),
    ("3 raw chat calls, 64 conc., uncapped", "chat3", 64, False),
    ("Strands 1 call, 64 conc., uncapped", "strands1", 64, False),
    ("Strands 3 calls, 64 conc., uncapped", "strands3", 64, False),
]
#: Tool calls the stub asks a Strands agent for before answering: one model call more.
STRANDS_TOOL_TURNS = {"strands1": 0, "strands3": 2}
#: Loads whose server CPU per rollout has a target (issue 19: at least 5x lower): the SDK's
#: own cost. The raw chat calls are the workflow's own HTTP client, the same in both.
CPU_TARGET_LOADS = ("no-op", "Strands 1 call")


def reference_python() -> Path:
    """The reference's interpreter, installing it on first use."""
    python = REFERENCE_VENV / "bin" / "python"
    marker = REFERENCE_VENV / f".installed-{'-'.join(REFERENCE_PINS)}"
    if marker.exists():
        return python
    shutil.rmtree(REFERENCE_VENV, ignore_errors=True)
    find = subprocess.run(
        ["bash", str(ROOT / "scripts" / "find_python312.sh")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    print(f"installing osmosis-ai=={REFERENCE} into {REFERENCE_VENV} ...", flush=True)
    subprocess.run([find.stdout.strip(), "-m", "venv", str(REFERENCE_VENV)], check=True)
    log = REFERENCE_VENV / "install.log"
    # Two steps: the pinned LiteLLM is outside what the reference's Strands extra declares, so
    # pip cannot resolve both at once; installed second, it replaces the broken one.
    steps = [[f"osmosis-ai[server,strands]=={REFERENCE}"], REFERENCE_PINS]
    with log.open("w") as output:
        for packages in steps:
            installed = subprocess.run(
                [str(python), "-m", "pip", "install", *packages],
                stdout=output, stderr=subprocess.STDOUT, check=False,
            )  # fmt: skip
            if installed.returncode != 0:
                raise SystemExit(f"installing the reference failed; see {log}")
    marker.touch()
    return python


@dataclass
class Side:
    """One SDK: its interpreter and the figures measured for it."""

    name: str
    python: str
    env: dict[str, str]
    figures: dict[str, list[float]] = field(default_factory=dict)

    def add(self, figure: str, value: float) -> None:
        self.figures.setdefault(figure, []).append(value)

    def median(self, figure: str) -> float:
        return statistics.median(self.figures[figure])

    def noisy(self, figure: str) -> bool:
        values = self.figures[figure]
        return len(values) > 1 and max(values) > NOISY_SPREAD * min(values)


@contextmanager
def _process(argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    try:
        yield process
    finally:
        process.kill()  # measurements are over; a graceful drain would only cost time
        process.wait()


@contextmanager
def _stub(tool_turns: int | None) -> Iterator[str]:
    argv = [sys.executable, str(HERE / "_stub_process.py")]
    argv += [str(tool_turns)] if tool_turns is not None else []
    with _process(argv, dict(os.environ)) as process:
        assert process.stdout is not None
        yield process.stdout.readline().strip()


@contextmanager
def _server(
    side: Side, kind: str, artifact_root: str, documented: bool = False
) -> Iterator[tuple[int, str]]:
    probe = bind_socket()
    port = probe.getsockname()[1]
    probe.close()
    env = {**side.env, "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": artifact_root}
    argv = [side.python, str(HERE / "_compare_server.py"), str(port), kind]
    argv += ["documented"] if documented else []
    with _process(argv, env) as process:
        yield process.pid, f"http://127.0.0.1:{port}"


async def _load(
    url: str, chat_url: str, concurrency: int, pid: int
) -> tuple[float, list[float], int, float, float, float]:
    """Rollouts/s, latencies (ms), failures, the load generator's own CPU seconds, the
    server's CPU seconds and the kernel's part of them, over a WINDOW_SEC window of
    closed-loop load.

    Each worker first runs one unmeasured rollout: the first rollouts of a server import
    what the workflow uses (Strands and its dependencies take seconds of CPU), a one-off
    cost that would otherwise land on the few rollouts of a slow load's window.
    """
    latencies: list[float] = []
    failures = 0
    counter = 0
    measuring = False
    async with RolloutClient(url=url) as client:
        await wait_ready(client)

        async def rollout() -> None:
            nonlocal failures, counter
            counter += 1
            started = time.perf_counter()
            # No grader in these rollouts: grade=false (the reference fails a rollout
            # asked to be graded without one).
            try:
                handle = await client.run_rollout(
                    PROMPT, chat_url, f"b{counter}-{started}", llm_api_key="bench", grade=False
                )
                succeeded = (await handle).status == "success"
            except RolloutProtocolError:  # e.g. a kept-alive connection the server closed
                succeeded = False
            if not measuring:
                return
            if succeeded:
                latencies.append((time.perf_counter() - started) * 1000)
            else:
                failures += 1

        async with asyncio.timeout(WARMUP_TIMEOUT_SEC):
            await asyncio.gather(*(rollout() for _ in range(concurrency)))
        measuring = True
        deadline = time.perf_counter() + WINDOW_SEC

        async def worker() -> None:
            while time.perf_counter() < deadline:
                await rollout()

        started, cpu = time.perf_counter(), time.process_time()
        server_cpu, server_kernel = cpu_seconds(pid), kernel_cpu_seconds(pid)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        server_cpu = cpu_seconds(pid) - server_cpu
        server_kernel = kernel_cpu_seconds(pid) - server_kernel
    return len(latencies) / elapsed, latencies, failures, cpu, server_cpu, server_kernel


async def _idle_rss_per_1000(side: Side, artifact_root: str) -> float:
    with _server(side, "idle", artifact_root) as (pid, url):
        async with RolloutClient(url=url) as client:
            await wait_ready(client)
            await asyncio.sleep(1.0)
            before = rss_mb(pid)
            for start in range(0, IDLE_ROLLOUTS, 200):
                await asyncio.gather(
                    *(
                        client.run_rollout(
                            PROMPT,
                            "http://127.0.0.1:9/v1",
                            f"idle-{i}",
                            llm_api_key="bench",
                            grade=False,
                        )
                        for i in range(start, start + 200)
                    )
                )
            await asyncio.sleep(2.0)
            after = rss_mb(pid)
    return (after - before) * 1000 / IDLE_ROLLOUTS


def _fresh_ms(python: str, code: list[str], env: dict[str, str]) -> float:
    samples = []
    for _ in range(IMPORT_RUNS):
        started = time.perf_counter()
        subprocess.run([python, *code], env=env, capture_output=True, check=True)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def _static_figures(side: Side) -> None:
    side.add(
        "import osmosis_ai.rollout (ms)",
        _fresh_ms(side.python, ["-c", "import osmosis_ai.rollout"], side.env),
    )
    side.add(
        "import osmosis_ai.rollout.server (ms)",
        _fresh_ms(side.python, ["-c", "import osmosis_ai.rollout.server"], side.env),
    )
    cli = str(Path(side.python).parent / "osmosis")
    side.add("osmosis --help (ms)", _fresh_ms(cli, ["--help"], side.env))


def _strands_overhead(side: Side, stub_url: str) -> None:
    done = subprocess.run(
        [side.python, str(HERE / "_compare_strands.py"), stub_url],
        env=side.env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    side.add("Strands added per LLM call (ms)", figures["strands_ms"] - figures["raw_ms"])


def _judgement(figure: str) -> tuple[str | None, float | None]:
    """Which way is better for ``figure`` ("high"/"low"/None) and its target ratio."""
    if figure.endswith("failed rollouts"):
        return None, None
    if figure.endswith("rollouts/s"):
        return "high", 5.0
    if figure.startswith("RSS"):
        return "low", 2.0
    if figure.startswith("Strands added"):
        return "low", 5.0
    if figure.endswith("server CPU per rollout (ms)") and figure.startswith(CPU_TARGET_LOADS):
        return "low", 5.0
    return "low", None


def _print(ours: Side, theirs: Side) -> None:
    print(f"\nours (this checkout, Python {sys.version.split()[0]}) vs the reference "
          f"(osmosis-ai {REFERENCE}, Python 3.12); medians")  # fmt: skip
    print(f"  {'figure':<56}{'ours':>10}{'theirs':>10}{'ratio':>9}  target")
    noisy = []
    for figure in ours.figures:
        mine, other = ours.median(figure), theirs.median(figure)
        better, target = _judgement(figure)
        ratio_text, verdict = "", ""
        if better is not None and mine > 0 and other > 0:
            # The ratio reads as "how many times better ours is".
            ratio = mine / other if better == "high" else other / mine
            ratio_text = f"{ratio:.1f}x"
            if target is not None:
                verdict = f">= {target:g}x {'met' if ratio >= target else 'MISSED'}"
        print(f"  {figure:<56}{mine:>10.1f}{other:>10.1f}{ratio_text:>9}  {verdict}")
        if ours.noisy(figure) or theirs.noisy(figure):
            noisy.append(figure)
    if noisy:
        print(f"\n  noisy (repeats spread over {NOISY_SPREAD - 1:.0%}): " + "; ".join(noisy))


async def main() -> None:
    ref_python = reference_python()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "_OSMOSIS_"))}
    base_env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    ours = Side("ours", sys.executable, dict(base_env))
    # A PYTHONPATH naming this checkout's src would shadow the reference's own package.
    theirs_env = {k: v for k, v in base_env.items() if k != "PYTHONPATH"}
    theirs = Side("theirs", str(ref_python), theirs_env)
    root = tempfile.mkdtemp(prefix="osmosis-compare-")
    try:
        with contextlib.ExitStack() as stubs:
            echo_url = stubs.enter_context(_stub(None))
            tool_urls = {k: stubs.enter_context(_stub(t)) for k, t in STRANDS_TOOL_TURNS.items()}
            for name, kind, concurrency, documented in LOADS:
                chat_url = tool_urls.get(kind, echo_url)
                for repeat in range(REPEATS):
                    for side in (ours, theirs) if repeat % 2 == 0 else (theirs, ours):
                        with _server(side, kind, root, documented) as (pid, url):
                            load = await _load(url, chat_url, concurrency, pid)
                        per_sec, latencies, failures, client_cpu, cpu, kernel = load
                        done = max(len(latencies), 1)
                        side.add(f"{name}: rollouts/s", per_sec)
                        side.add(f"{name}: server CPU per rollout (ms)", cpu * 1000 / done)
                        side.add(
                            f"{name}: server CPU in the kernel per rollout (ms)",
                            kernel * 1000 / done,
                        )
                        side.add(f"{name}: client CPU per rollout (ms)", client_cpu * 1000 / done)
                        ordered = sorted(latencies) or [float("nan")]
                        side.add(f"{name}: p50 latency (ms)", ordered[len(ordered) // 2])
                        side.add(f"{name}: p99 latency (ms)", ordered[int(len(ordered) * 0.99)])
                        side.add(f"{name}: failed rollouts", float(failures))
                        print(
                            f"  {side.name:<6} {name}: {per_sec:.1f}/s ({failures} failed)",
                            flush=True,
                        )
            for repeat in range(2):
                for side in (ours, theirs) if repeat % 2 == 0 else (theirs, ours):
                    side.add(
                        "RSS per 1,000 idle in-flight rollouts (MB)",
                        await _idle_rss_per_1000(side, root),
                    )
                    _strands_overhead(side, echo_url)
        for side in (ours, theirs):
            _static_figures(side)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _print(ours, theirs)


if __name__ == "__main__":
    asyncio.run(main())
