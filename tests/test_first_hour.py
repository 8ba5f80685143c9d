"""The README's first hour, run as written: every command of its block, in order, in an
empty folder, on the embedded model (the README's `make demo` is CI's readme-demo phase)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import httpx2
import pytest

from tests.subprocesses import communicate_within

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[1] / "README.md"
BIN = str(Path(sys.executable).parent)


def first_hour_commands() -> list[str]:
    """The commands of the README's first-hour block, continuation lines joined."""
    text = README.read_text()
    block = re.search(r"<!-- first-hour.*?-->\n```bash\n(.*?)```\n<!-- /first-hour -->", text, re.S)
    assert block, "the README's first-hour block"
    return [line for line in block.group(1).replace("\\\n", " ").splitlines() if line.strip()]


def test_the_block_is_the_path_the_readme_promises() -> None:
    verbs = [" ".join(command.split()[:3]) for command in first_hour_commands()]
    assert verbs == [
        "osmosis rollout init",
        "osmosis rollout validate",
        "osmosis eval run",
        "osmosis train run",
        "osmosis eval run",
        "osmosis view #",
    ]


async def _shell(command: str, cwd: Path, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        "bash", "-c", command, cwd=cwd, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # Ctrl-C reaches the command, as from a terminal
    )  # fmt: skip


async def test_the_first_hour_runs_as_written(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    *commands, view = first_hour_commands()
    outputs = []
    for command in commands:
        process = await _shell(command, tmp_path, env)
        out = (await communicate_within(process, 240))[0].decode()
        assert process.returncode == 0, f"{command}\n{out}"
        outputs.append(out)
    trained, checkpoint = outputs[3], outputs[4]
    assert "held-out results" in trained and "step 2:" in trained, trained
    assert "Model         torch:" in checkpoint and "pass rate" in checkpoint, checkpoint
    assert "warning:" not in "".join(outputs[2:5])  # the scaffold's rollout calls the model

    process = await _shell(view, tmp_path, env)
    try:
        assert process.stdout is not None
        async with asyncio.timeout(60):
            line = (await process.stdout.readline()).decode()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, line
        async with httpx2.AsyncClient(base_url=url.group(0), timeout=30) as http:
            page, evals, train = [await http.get(p) for p in ("/", "/api/runs", "/api/train")]
        assert page.status_code == 200 and "<!doctype html>" in page.text
        assert "my-rollout-trained" in evals.text and "my-rollout" in train.text, train.text
    finally:
        os.killpg(process.pid, signal.SIGINT)
        await communicate_within(process, 60)
