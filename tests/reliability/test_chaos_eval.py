"""Chaos through `osmosis eval run`: 500 rows with injected faults, the rollout server
SIGTERMed mid-run, then the run resumed. Every work item ends with exactly one terminal
journal record, whose category is the one its fault calls for."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.testing import StubFailure, StubReply
from tests.eval.conftest import Workspace

pytestmark = pytest.mark.slow  # left out of make test-fast

ROWS = 500
#: fault -> (share, journal (status, error_type)). Blocking code runs in its own process
#: (``--backend process``), so it cannot delay the other rollouts past their deadline.
FAULTS = {
    "raise": (0.10, ("failed", "agent_error")),
    "hang": (0.05, ("failed", "timeout")),
    "block": (0.05, ("failed", "timeout")),
    "upstream_5xx": (0.05, ("failed", "agent_error")),
    "upstream_hang": (0.05, ("failed", "timeout")),
}
NONE = ("success", None)


def _respond(body: dict[str, Any]) -> StubReply | StubFailure:
    text = (body.get("messages") or [{}])[-1].get("content") or ""
    if "upstream_5xx" in text:
        return StubFailure(503, message="upstream overloaded")
    if "upstream_hang" in text:
        return StubReply(content="too late", delay_sec=30)
    return StubReply(content="ok")


def _server_pids(parent: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == parent and b"_bootstrap" in cmdline:
            pids.append(int(entry))
    return pids


@pytest.mark.timeout(300)
async def test_sigterm_and_resume_loses_and_duplicates_nothing(workspace: Workspace) -> None:
    workspace.stub._respond = _respond
    plan = [fault for fault, (share, _) in FAULTS.items() for _ in range(int(ROWS * share))]
    plan += ["none"] * (ROWS - len(plan))
    random.Random(11).shuffle(plan)
    workspace.write_rows(
        [
            {"user_prompt": f"fault {fault} #{i}", "ground_truth": "ok", "metadata": {"do": fault}}
            for i, fault in enumerate(plan)
        ]
    )
    workspace.write_config(evaluation="batch_size = 64")
    config = workspace.config.read_text().replace(
        "agent_workflow_timeout_s = 30", "agent_workflow_timeout_s = 2"
    )
    workspace.config.write_text(config)
    run_dir = workspace.root / ".osmosis" / "evals" / "chaos"
    journal = run_dir / "events.jsonl"

    first = await workspace.start("--name", "chaos", "--backend", "process")
    async with asyncio.timeout(120):
        while not journal.exists() or journal.read_text().count("\n") < 150:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        [server] = _server_pids(first.pid)
        os.kill(server, signal.SIGTERM)
        output, _ = await first.communicate()
    assert first.returncode == 1, output.decode()[-2000:]  # halted with work pending
    done_before = journal.read_text().count("\n")
    assert 150 <= done_before < ROWS

    code, output_text = await workspace.run(
        "--name", "chaos", "--backend", "process", limit_sec=240
    )
    assert code == 0, output_text[-2000:]

    lines = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    records = [line for line in lines if "row_index" in line]
    per_item = Counter((r["row_index"], r["run_index"]) for r in records)
    assert len(per_item) == ROWS and set(per_item.values()) == {1}  # exactly one each
    wrong = [
        (r["row_index"], plan[r["row_index"]], r["status"], r.get("error_type"))
        for r in records
        if (r["status"], r.get("error_type")) != FAULTS.get(plan[r["row_index"]], (0, NONE))[1]
    ]
    assert wrong == []
