"""Everything CI checks, as phases that run side by side where they do not depend on each other.

``python3 scripts/ci.py`` (what ``make test`` and ``.ci/run`` run) builds the environments,
runs the README's main job in an environment built only from the README's commands, lints,
type-checks and runs every test suite. Each phase is a ``make`` target, so any one can be run
alone; a phase starts once the phases it needs have passed (a phase whose prerequisite failed
does not run). Its output goes to ``.ci-logs/<phase>.log`` and is printed whole when it ends,
so concurrent phases never interleave. At the end: one line per phase with its wall time,
the test counts against the recorded ones (``.ci/test-counts.json``: a suite that ran fewer
tests, or skipped more, fails the run), and the totals.

Standard library only: it runs before any environment exists.

    python3 scripts/ci.py                 # every phase
    python3 scripts/ci.py --only lint     # some phases, and what they need
    python3 scripts/ci.py --record        # after adding tests: store the new counts
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "COUNTS",
    "PHASES",
    "PHASE_DEFAULTS",
    "Phase",
    "Result",
    "SuiteCount",
    "check_counts",
    "main",
    "phase_table",
]

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / ".ci-logs"
COUNTS = ROOT / ".ci" / "test-counts.json"
#: No phase may take longer than this (CI's own limit is 90 minutes, for every phase: the
#: main suite, which starts after ~6 minutes of installs, took 45 minutes beside the other
#: phases on a slow 2-core machine, where 50 stopped it).
PHASE_LIMIT_SEC = 75 * 60
#: What every phase runs with unless the environment says otherwise. One compute thread a
#: process (torch; the embedded model follows OMP_NUM_THREADS too): the phases run side by
#: side on CI's two cores, where threads that wait for each other by spinning stall whenever
#: one of them is descheduled (see tests/conftest.py).
PHASE_DEFAULTS = {"OMP_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Phase:
    """One step of the run: a ``make`` target, run once the phases in ``after`` passed."""

    name: str
    target: Sequence[str]
    after: tuple[str, ...] = ()
    suite: str | None = None
    """The test suite it runs (its junit file is read and its count checked)."""
    as_a_user: bool = False
    """Runs with a user's defaults: none of `PHASE_DEFAULTS`, even where the environment
    sets them (what CI times must be what a user gets)."""

    def environment(self) -> dict[str, str]:
        if self.as_a_user:
            return {k: v for k, v in os.environ.items() if k not in PHASE_DEFAULTS}
        return {**PHASE_DEFAULTS, **os.environ}

    def command(self) -> list[str]:
        command = ["make", "--no-print-directory", *self.target]
        if self.suite is not None:
            report = LOGS / f"{self.suite}.xml"
            command.append(f"PYTEST_ARGS=--durations=30 --junitxml={report}")
        return command


PHASES: tuple[Phase, ...] = (
    Phase("install-dev", ["install-dev"]),
    Phase("install-vllm", ["install-vllm"]),
    Phase("install-harbor", ["install-harbor"]),
    Phase("install-engines", ["install-engines"]),
    Phase("install-openenv", ["install-openenv"]),
    Phase("install-verifiers", ["install-verifiers"]),
    Phase("debian-packages", ["debian-packages"]),
    # The README's main job, in an environment built only by the README's command: every
    # rollout must run (--strict), which the test environment, with every extra, cannot show.
    # It runs with a user's thread defaults, beside the other phases: a busy machine.
    Phase("readme-demo", ["demo", "VENV=.venv-readme", "DEMO_FLAGS=--strict"], as_a_user=True),
    Phase("lint", ["lint"], after=("install-dev",)),
    Phase("type-check", ["type-check"], after=("install-dev",)),
    Phase(
        "tests-main",
        ["suite-main"],
        after=(
            "install-dev",
            "install-vllm",
            "install-openenv",
            "install-verifiers",
            "debian-packages",
        ),
        suite="main",
    ),
    Phase(
        "tests-harbor",
        ["suite-harbor"],
        after=("install-harbor", "debian-packages"),
        suite="harbor",
    ),
    Phase("tests-engines", ["suite-engines"], after=("install-engines",), suite="engines"),
)


@dataclass
class Result:
    phase: Phase
    started: float
    seconds: float
    returncode: int | None
    """None: not run, since a phase it needs failed."""
    note: str = ""


@dataclass
class SuiteCount:
    """How many tests of a suite ran (passed or failed) and were skipped."""

    ran: int = 0
    failed: int = 0
    skipped: int = 0

    @classmethod
    def read(cls, report: Path) -> SuiteCount:
        root = ElementTree.parse(report).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        count = cls()
        for suite in suites:
            tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
            count.ran += tests - skipped
            count.skipped += skipped
            count.failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        return count


@dataclass
class Run:
    phases: Sequence[Phase]
    started: float = field(default_factory=time.monotonic)
    results: dict[str, Result] = field(default_factory=dict)

    def run_phase(self, phase: Phase) -> Result:
        LOGS.mkdir(exist_ok=True)
        log = LOGS / f"{phase.name}.log"
        started = time.monotonic()
        with log.open("wb") as out:
            process = subprocess.Popen(
                phase.command(),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=phase.environment(),
                start_new_session=True,  # its whole tree can be stopped
            )
            try:
                returncode = process.wait(timeout=PHASE_LIMIT_SEC)
                note = ""
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                returncode = process.wait()
                note = f"stopped after {PHASE_LIMIT_SEC} s"
            except BaseException:
                os.killpg(process.pid, signal.SIGKILL)
                raise
        return Result(phase, started - self.started, time.monotonic() - started, returncode, note)

    def execute(self) -> None:
        pending = list(self.phases)
        running: dict[Future[Result], Phase] = {}
        with ThreadPoolExecutor(max_workers=len(self.phases)) as pool:
            while pending or running:
                for phase in list(pending):
                    needs = [self.results.get(name) for name in phase.after]
                    if any(r is not None and r.returncode != 0 for r in needs):
                        pending.remove(phase)
                        failed = ", ".join(n for n, r in zip(phase.after, needs, strict=True) if r)
                        self._report(Result(phase, 0, 0, None, f"not run: {failed} failed"))
                    elif all(r is not None for r in needs):
                        pending.remove(phase)
                        print(f"== start {phase.name} (+{self._elapsed():.0f} s)", flush=True)
                        running[pool.submit(self.run_phase, phase)] = phase
                if not running:
                    continue
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    running.pop(future)
                    self._report(future.result())

    def _elapsed(self) -> float:
        return time.monotonic() - self.started

    def _report(self, result: Result) -> None:
        self.results[result.phase.name] = result
        status = _status(result)
        print(f"== {result.phase.name}: {status} in {result.seconds:.0f} s", flush=True)
        log = LOGS / f"{result.phase.name}.log"
        if result.returncode is not None and log.is_file():
            sys.stdout.write(log.read_text(errors="replace"))
            print(f"== end of {result.phase.name}", flush=True)


def _status(result: Result) -> str:
    if result.returncode is None:
        return result.note
    verdict = "ok" if result.returncode == 0 else f"FAILED (exit {result.returncode})"
    return f"{verdict}, {result.note}" if result.note else verdict


def phase_table(results: Iterable[Result], total: float) -> str:
    """The run's phases, one line each: start, wall time, outcome."""
    lines = [f"{'phase':<18}{'start':>8}{'wall':>8}  outcome"]
    for result in sorted(results, key=lambda r: (r.returncode is None, r.started)):
        start = f"{result.started:.0f} s" if result.returncode is not None else "-"
        wall = f"{result.seconds:.0f} s" if result.returncode is not None else "-"
        lines.append(f"{result.phase.name:<18}{start:>8}{wall:>8}  {_status(result)}")
    lines.append(f"{'total':<18}{'':>8}{total:>6.0f} s")
    return "\n".join(lines)


def check_counts(counts: dict[str, SuiteCount], recorded: dict[str, dict[str, int]]) -> list[str]:
    """Why the counts fall short of the recorded ones (a suite ran fewer tests, or skipped
    more); empty when they do not."""
    problems = []
    for suite, count in sorted(counts.items()):
        floor = recorded.get(suite)
        if floor is None:
            problems.append(f"{suite}: no recorded count; run scripts/ci.py --record")
            continue
        if count.ran < floor["ran"]:
            problems.append(
                f"{suite}: {count.ran} tests ran, fewer than the {floor['ran']} recorded in "
                f"{COUNTS.relative_to(ROOT)} (a test was removed, deselected or not collected)"
            )
        if count.skipped > floor["skipped"]:
            problems.append(
                f"{suite}: {count.skipped} tests skipped, more than the {floor['skipped']} "
                "recorded (a skip must not stand in for a test)"
            )
    return problems


def _selected(only: Sequence[str]) -> list[Phase]:
    """The phases named, with every phase they need."""
    by_name = {phase.name: phase for phase in PHASES}
    unknown = [name for name in only if name not in by_name]
    if unknown:
        raise SystemExit(f"unknown phase {', '.join(unknown)}; phases: {', '.join(by_name)}")
    wanted: set[str] = set()
    stack = list(only)
    while stack:
        name = stack.pop()
        if name not in wanted:
            wanted.add(name)
            stack.extend(by_name[name].after)
    return [phase for phase in PHASES if phase.name in wanted]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=[], metavar="PHASE")
    parser.add_argument("--record", action="store_true", help="store the suites' test counts")
    args = parser.parse_args(argv)
    phases = _selected(args.only) if args.only else list(PHASES)
    for stale in LOGS.glob("*.xml") if LOGS.is_dir() else ():
        stale.unlink()
    run = Run(phases)
    run.execute()
    total = time.monotonic() - run.started
    counts = {
        phase.suite: SuiteCount.read(LOGS / f"{phase.suite}.xml")
        for phase in phases
        if phase.suite is not None and (LOGS / f"{phase.suite}.xml").is_file()
    }
    print("\n" + phase_table(run.results.values(), total))
    failed = [r.phase.name for r in run.results.values() if r.returncode != 0]
    recorded = json.loads(COUNTS.read_text()) if COUNTS.is_file() else {}
    if args.record:
        for suite, count in counts.items():
            recorded[suite] = {"ran": count.ran, "skipped": count.skipped}
        COUNTS.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    for suite, count in sorted(counts.items()):
        floor = recorded.get(suite, {})
        print(
            f"tests {suite}: {count.ran} ran (recorded {floor.get('ran', '-')}), "
            f"{count.failed} failed, {count.skipped} skipped (recorded {floor.get('skipped', '-')})"
        )
    # Only a full run sees every suite; --only checks the suites it ran.
    problems = check_counts(counts, recorded)
    for problem in problems:
        print(f"test count: {problem}")
    passed = sum(c.ran - c.failed for c in counts.values())
    failures = sum(c.failed for c in counts.values())
    skipped = sum(c.skipped for c in counts.values())
    closing = f"total: {passed} passed, {failures} failed"
    print(closing + (f", {skipped} skipped" if skipped else ""))
    if failed:
        print(f"failed phases: {', '.join(failed)}")
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
