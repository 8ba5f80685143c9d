"""scripts/ci.py: the phase graph, the phase table, the suites' counts and their floor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from scripts.ci import (
    COUNTS,
    LOGS,
    PHASES,
    Phase,
    Result,
    Run,
    SuiteCount,
    check_counts,
    phase_table,
)

ROOT = Path(__file__).resolve().parents[1]

JUNIT = """\
<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="3" tests="40"
time="1.0"></testsuite></testsuites>
"""


def test_every_phase_needs_only_phases_that_exist_and_each_suite_has_a_count() -> None:
    names = {phase.name for phase in PHASES}
    assert len(names) == len(PHASES)
    for phase in PHASES:
        assert set(phase.after) <= names, phase
    suites = {phase.suite for phase in PHASES if phase.suite is not None}
    assert suites == {"main", "harbor", "engines"}
    recorded = json.loads(COUNTS.read_text())
    assert set(recorded) == suites
    assert all(count["ran"] > 0 and count["skipped"] == 0 for count in recorded.values())


def test_the_readme_demo_runs_in_its_own_environment_and_strictly() -> None:
    (demo,) = [phase for phase in PHASES if phase.name == "readme-demo"]
    assert demo.after == () and "VENV=.venv-readme" in demo.target
    assert "DEMO_FLAGS=--strict" in demo.target
    assert demo.as_a_user and all(not phase.as_a_user for phase in PHASES if phase is not demo)


def test_a_suite_phase_writes_its_junit_report_and_slowest_tests() -> None:
    (main,) = [phase for phase in PHASES if phase.suite == "main"]
    command = main.command()
    assert command[:3] == ["make", "--no-print-directory", "suite-main"]
    assert command[-1].startswith("PYTEST_ARGS=--durations=30 --junitxml=")


@pytest.mark.parametrize(
    ("exported", "as_a_user", "seen"),
    [(None, False, "1"), ("3", False, "3"), (None, True, ""), ("3", True, "")],
)
def test_a_phase_runs_one_compute_thread_unless_the_environment_says_otherwise_or_as_a_user(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    exported: str | None,
    as_a_user: bool,
    seen: str,
) -> None:
    makefile = tmp_path / "Makefile"
    makefile.write_text("show:\n\t@echo threads=$$OMP_NUM_THREADS\n")
    if exported is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", exported)
    phase = Phase(f"threads-{tmp_path.name}", ["-f", str(makefile), "show"], as_a_user=as_a_user)
    log = LOGS / f"{phase.name}.log"
    try:
        result = Run([phase]).run_phase(phase)
        assert result.returncode == 0 and log.read_text().strip() == f"threads={seen}"
    finally:
        log.unlink(missing_ok=True)


def test_suite_counts_are_read_from_junit(tmp_path: Path) -> None:
    report = tmp_path / "main.xml"
    report.write_text(JUNIT)
    count = SuiteCount.read(report)
    assert (count.ran, count.failed, count.skipped) == (37, 3, 3)


def test_fewer_tests_or_more_skips_than_recorded_are_named() -> None:
    recorded = {"main": {"ran": 100, "skipped": 0}, "harbor": {"ran": 5, "skipped": 1}}
    counts = {
        "main": SuiteCount(ran=99),
        "harbor": SuiteCount(ran=6, skipped=2),
        "engines": SuiteCount(ran=3),
    }
    problems = check_counts(counts, recorded)
    assert problems == [
        "engines: no recorded count; run scripts/ci.py --record",
        "harbor: 2 tests skipped, more than the 1 recorded (a skip must not stand in for a test)",
        "main: 99 tests ran, fewer than the 100 recorded in .ci/test-counts.json (a test was "
        "removed, deselected or not collected)",
    ]
    assert check_counts({"main": SuiteCount(ran=120)}, recorded) == []


def test_the_table_has_a_line_per_phase_in_start_order_then_the_total() -> None:
    lint, tests, skipped = Phase("lint", ["lint"]), Phase("tests", ["t"]), Phase("x", ["x"])
    table = phase_table(
        [
            Result(tests, 90.2, 600.4, 0),
            Result(lint, 89.6, 12.0, 2, "stopped after 3000 s"),
            Result(skipped, 0, 0, None, "not run: lint failed"),
        ],
        700.0,
    )
    assert table.splitlines() == [
        "phase                start    wall  outcome",
        "lint                  90 s    12 s  FAILED (exit 2), stopped after 3000 s",
        "tests                 90 s   600 s  ok",
        "x                        -       -  not run: lint failed",
        "total                        700 s",
    ]


def test_an_unknown_phase_is_one_line() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ci.py"), "--only", "lnt"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("unknown phase lnt; phases: install-dev, ")
