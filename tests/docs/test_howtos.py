"""Every command of the training how-to pages (``docs/train/``), run as written.

In a copy of the workspace the page's commands are written for (the calculator example, or
the scaffold ``osmosis rollout init`` writes, itself one of the commands):

- ``osmosis train run ...`` runs with ``--print-config``: the config and flags resolve as the
  run would resolve them (each ``--set`` value shows in the printed config), with no training;
  the whole runs are the suite's training tests;
- ``osmosis rollout init``, ``osmosis train export`` (on a finished run of that name) and
  ``osmosis view`` (until it prints its address) run as they are;
- the other commands (installers, the GPU check) cannot run here: the scripts they name exist
  and accept each flag they give (their ``--help`` lists it).
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import signal
import sys
import tomllib
from pathlib import Path

import pytest

from tests.subprocesses import communicate_within
from tests.train.conftest import tiny_model_dir, tokenizer_dir  # noqa: F401 -- fixtures
from tests.train.training_project import PROJECT, config_text, write_rows

ROOT = Path(__file__).resolve().parents[2]
HOWTOS = sorted(
    ROOT / "docs" / "train" / f"{name}.md"
    for name in ("your-workflow", "gpu", "vllm", "lora", "async", "resume", "trackers", "recipes")
)
BIN = Path(sys.executable).parent
_BASH = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)

pytestmark = pytest.mark.slow


def commands(page: Path) -> list[list[str]]:
    """The commands of ``page``'s bash blocks, one per line, without their comments."""
    found = []
    for block in _BASH.findall(page.read_text(encoding="utf-8")):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                found.append(words)
    return found


def test_every_how_to_has_commands() -> None:
    for page in HOWTOS:
        assert any(words[0] == "osmosis" for words in commands(page)), page.name


async def _run(words: list[str], cwd: Path, limit_sec: float = 120) -> tuple[int, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    process = await asyncio.create_subprocess_exec(
        *words, cwd=cwd, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out = (await communicate_within(process, limit_sec))[0].decode()
    assert process.returncode is not None
    return process.returncode, out


def _workspace(page: Path, root: Path) -> Path:
    if page.stem == "your-workflow":  # its first command writes the workspace
        root.mkdir()
        return root
    shutil.copytree(
        ROOT / "examples" / "calculator", root, ignore=shutil.ignore_patterns(".osmosis")
    )
    return root


async def _finished_run(workspace: Path, name: str, model_dir: Path) -> None:
    """A finished one-step run called ``name`` in ``workspace`` (the tiny project's rollout
    and model: what export reads is the run directory)."""
    shutil.copytree(PROJECT / "rollouts" / "tiny", workspace / "rollouts" / "tiny")
    write_rows(workspace)
    config = workspace / "configs" / "training" / "tiny.toml"
    config.write_text(config_text(model_dir, "steps = 1"))
    code, out = await _run(["osmosis", "train", "run", str(config), "--name", name], workspace)
    assert code == 0, out


def _check_flags(words: list[str], help_text: str) -> None:
    for word in words:
        if word.startswith("--"):
            assert word.split("=")[0] in help_text, f"{shlex.join(words)}: {word} unknown"


@pytest.mark.parametrize("page", HOWTOS, ids=lambda p: p.stem)
async def test_a_how_to_s_commands_run_as_written(
    page: Path,
    tmp_path: Path,
    tiny_model_dir: Path,  # noqa: F811 -- the fixture imported above
) -> None:
    workspace = _workspace(page, tmp_path / "ws")
    reads_runs = [
        w for w in commands(page) if w[:2] == ["osmosis", "view"] or w[1:3] == ["train", "export"]
    ]
    if reads_runs:  # a finished run of the name the page uses, for them to read
        await _finished_run(workspace, "calculator", tiny_model_dir)
    for words in commands(page):
        command = shlex.join(words)
        if words[:3] == ["osmosis", "train", "run"]:
            code, out = await _run([*words, "--print-config"], workspace)
            assert code == 0, f"{command}\n{out}"
            printed = tomllib.loads(out)
            for flag, value in zip(words, words[1:], strict=False):
                if flag == "--set":
                    *path, key = value.split("=", 1)[0].split(".")
                    table = printed
                    for part in path:
                        table = table[part]
                    assert key in table, f"{command}: {value} is not in the resolved config"
        elif words[:3] == ["osmosis", "rollout", "init"]:
            code, out = await _run(words, workspace)
            assert code == 0, f"{command}\n{out}"
        elif words[:3] == ["osmosis", "train", "export"]:
            code, out = await _run(words, workspace)
            assert code == 0 and "exported" in out, f"{command}\n{out}"
            assert (workspace / words[-1] / "config.json").is_file()
        elif words[:2] == ["osmosis", "view"]:
            await _serves(words, workspace)
        elif words[0] == "python" and words[1].startswith("benchmarks/"):
            script = ROOT / words[1]
            code, out = await _run([sys.executable, str(script), "--help"], ROOT)
            assert code == 0, out
            _check_flags(words[2:], out)
        else:  # installers: what they install from is named in the page, nothing to run here
            assert words[0] in ("python3.11", ".venv-vllm/bin/pip"), command


async def _serves(words: list[str], workspace: Path) -> None:
    """``osmosis view`` prints its address, then is stopped as Ctrl-C stops it."""
    process = await asyncio.create_subprocess_exec(
        *words, cwd=workspace, env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        async with asyncio.timeout(60):
            line = (await process.stdout.readline()).decode()
        assert re.search(r"http://127\.0\.0\.1:\d+/", line), line
    finally:
        process.send_signal(signal.SIGINT)
        await communicate_within(process, 30)
