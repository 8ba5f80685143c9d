"""Eval fixtures: a copy of the probe workspace wired to a real stub model server."""

from __future__ import annotations

import asyncio
import errno
import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from osmosis_ai.testing import ChatStub
from tests.subprocesses import communicate_within

WORKSPACE = Path(__file__).resolve().parent / "workspace"
OSMOSIS = str(Path(sys.executable).with_name("osmosis"))
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Workspace:
    root: Path
    config: Path
    dataset: Path
    stub: ChatStub
    rollout: str = "probe"

    def write_rows(self, rows: list[dict[str, Any]]) -> None:
        self.dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))

    def write_config(self, *, evaluation: str = "", model: str | None = None) -> None:
        model = model or f"openai:{self.stub.base_url}:stub-model"
        self.config.write_text(
            "[experiment]\n"
            f'rollout = "{self.rollout}"\nentrypoint = "main.py"\n'
            f'model_path = "{model}"\ndataset = "data/rows.jsonl"\n'
            f"[evaluation]\nagent_workflow_timeout_s = 30\ngrader_timeout_s = 10\n{evaluation}\n"
        )

    async def start(self, *args: str, wrapper: tuple[str, ...] = ()) -> asyncio.subprocess.Process:
        """``osmosis eval run <config> *args`` as a child process (under ``wrapper``, a
        command such as ``strace ...``), output piped."""
        return await asyncio.create_subprocess_exec(
            *wrapper, OSMOSIS, "eval", "run", str(self.config), *args,
            cwd=self.root,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip

    async def run(
        self, *args: str, limit_sec: float = 120, wrapper: tuple[str, ...] = ()
    ) -> tuple[int, str]:
        process = await self.start(*args, wrapper=wrapper)
        out, _ = await communicate_within(process, limit_sec)
        assert process.returncode is not None
        return process.returncode, out.decode()

    def run_dirs(self) -> list[Path]:
        evals = self.root / ".osmosis" / "evals"
        return sorted(p for p in evals.iterdir() if p.is_dir() and not p.name.startswith("."))


def rows(count: int, **extra: Any) -> list[dict[str, Any]]:
    """Rows whose answer the stub echoes back (so they pass)."""
    return [
        {"user_prompt": f"say token{index}", "ground_truth": f"token{index}", **extra}
        for index in range(count)
    ]


@pytest_asyncio.fixture
async def workspace(tmp_path: Path) -> AsyncIterator[Workspace]:
    root = tmp_path / "ws"
    shutil.copytree(WORKSPACE, root)
    (root / "configs" / "eval").mkdir(parents=True)
    (root / "data").mkdir()
    async with ChatStub() as stub:
        ws = Workspace(
            root, root / "configs" / "eval" / "probe.toml", root / "data" / "rows.jsonl", stub
        )
        ws.write_config()
        ws.write_rows(rows(4))
        yield ws


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MiB tmpfs, so writes can really fail with ENOSPC (needs root, as CI has)."""
    mount_point = tmp_path / "small-fs"
    mount_point.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0755", "tmpfs", str(mount_point)],
        check=True,
    )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill_filesystem(path: Path) -> None:
    """Write ``path`` until its filesystem has no space left (the file then holds it all)."""
    block = b"\0" * 65536
    with path.open("wb", buffering=0) as file:
        try:
            for _ in range(1 << 16):  # bounded: 4 GiB, far beyond any test filesystem
                file.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            return
    raise AssertionError(f"{path} never filled its filesystem")


async def evaluate_example(
    tmp_path: Path, example: str, *args: str, limit_sec: float = 240
) -> tuple[Path, str, list[dict[str, Any]]]:
    """``osmosis eval run`` (``--json``, then ``args``) of a copy of ``examples/<example>`` as
    shipped, on 2 rows of the embedded model, checked to have graded both; returns the run
    directory, its ``logs.txt`` and the agent steps of row 0's trajectory, each checked to
    carry the gateway's token ids."""
    workspace = tmp_path / example
    shutil.copytree(
        ROOT / "examples" / example, workspace, ignore=shutil.ignore_patterns(".osmosis")
    )
    process = await asyncio.create_subprocess_exec(
        OSMOSIS, "eval", "run", f"configs/eval/{example}.toml", "--rows", "0-1", "--json", *args,
        cwd=workspace,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await communicate_within(process, limit_sec)
    assert process.returncode == 0, (err or b"").decode()
    payload = json.loads(out)
    assert payload["complete"] and payload["dispatched"] == 2
    summary = payload["metrics"]["summary"]
    assert summary["total_samples"] == 2 and summary["graded"] == 2, payload["failed_rows"]
    assert isinstance(summary["reward_stats"]["mean"], float)  # whatever the tiny model got
    run_dir = Path(payload["output_path"])
    trajectory = json.loads((run_dir / "trajectories" / "row_0_run_0.json").read_text())
    agent = [step for step in trajectory["steps"] if step["source"] == "agent"]
    assert agent and all(
        len(step["metrics"]["completion_token_ids"]) == step["metrics"]["completion_tokens"]
        for step in agent
    )
    return run_dir, (run_dir / "logs.txt").read_text(), agent
