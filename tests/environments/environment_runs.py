"""What the environments' whole-run tests share: configs with an ``[environment]`` and no
rollout folder or dataset, the CLI run as a child process, the Python of a library's own
environment."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.eval.conftest import OSMOSIS
from tests.subprocesses import communicate_within
from tests.train.training_project import config_text

ROOT = Path(__file__).resolve().parents[2]


def eval_config(root: Path, name: str, model: str, environment: str, evaluation: str) -> Path:
    """``configs/eval/<name>.toml`` of ``root``: the run ``name`` of ``model`` on
    ``environment`` (an ``[environment]`` table), with ``evaluation``'s keys."""
    path = root / "configs" / "eval" / f"{name}.toml"
    path.parent.mkdir(parents=True)
    path.write_text(
        f'[experiment]\nrollout = "{name}"\nmodel_path = "{model}"\n{environment}'
        f"[evaluation]\n{evaluation}\n"
    )
    return path


def training_config(
    root: Path, name: str, model_dir: Path, settings: str, environment: str
) -> Path:
    """``configs/training/<name>.toml`` of ``root``: the tiny project's settings with
    ``settings`` over them (`config_text`), its rows and rollout those of ``environment``."""
    path = root / "configs" / "training" / f"{name}.toml"
    path.parent.mkdir(parents=True)
    text = config_text(model_dir, settings)
    text = text.replace('entrypoint = "main.py"\n', "").replace('dataset = "data/rows.jsonl"\n', "")
    path.write_text(text + environment)
    return path


async def osmosis(cwd: Path, *args: str, limit_sec: float = 300) -> tuple[int, str]:
    """``osmosis *args`` in ``cwd``: its exit status and output."""
    process = await asyncio.create_subprocess_exec(
        OSMOSIS, *args, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await communicate_within(process, limit_sec)
    assert process.returncode is not None
    return process.returncode, out.decode()


def eval_run_dir(root: Path) -> Path:
    """The one eval run of the workspace ``root``."""
    evals = root / ".osmosis" / "evals"
    (run_dir,) = (p for p in evals.iterdir() if p.is_dir() and not p.name.startswith("."))
    return run_dir


def library_python(venv: str, target: str, modules: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The Python of the repository's ``venv`` (made by ``make <target>``), with ``modules``
    on the import path of every process the test starts."""
    python = ROOT / venv / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"these tests need {venv}: run `make {target}`")
    monkeypatch.setenv("PYTHONPATH", str(modules))
    return python
