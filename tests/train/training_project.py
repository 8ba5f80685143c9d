"""The tiny training project of these tests (``project/``): a workspace with six rows and a
``configs/training/tiny.toml``, and ``osmosis train run`` on it, as a subprocess or here."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import signal
import sys
import tomllib
from pathlib import Path
from typing import Any

from osmosis_ai.config.schema import toml_value
from osmosis_ai.train.loop.runner import TrainOptions, TrainOutcome, run_training
from tests.subprocesses import communicate_within

PROJECT = Path(__file__).resolve().parent / "project"
OSMOSIS = str(Path(sys.executable).with_name("osmosis"))


def write_rows(root: Path, prompt: str = "", **metadata: object) -> None:
    rows = [
        {"user_prompt": f"count to {i}{prompt}", "ground_truth": str(i), **metadata}
        for i in range(6)
    ]
    (root / "data" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


#: The tiny project's settings, by section; a test's own are merged over them.
BASE_SETTINGS: dict[str, dict[str, Any]] = {
    "training": {"prompts_per_step": 2, "group_size": 3},
    "sampling": {"max_tokens": 8},
    "learner": {"learning_rate": 0.001, "token_budget": 2048},
    "eval": {"rows": 2},
}


def config_text(model_dir: Path, settings: str) -> str:
    """``configs/training/tiny.toml``: `BASE_SETTINGS` with ``settings`` (TOML, whose keys
    before any table header are ``[training]``'s) merged over them, table by table."""
    merged = copy.deepcopy(BASE_SETTINGS)
    extra = tomllib.loads(settings)
    training = {key: value for key, value in extra.items() if not isinstance(value, dict)}
    tables = {key: value for key, value in extra.items() if isinstance(value, dict)}
    _merge(merged, {"training": training, **tables})
    text = (
        "[experiment]\n"
        'rollout = "tiny"\nentrypoint = "main.py"\n'
        f'model = "{model_dir}"\ndataset = "data/rows.jsonl"\n'
    )
    return text + _tables(merged)


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _tables(tables: dict[str, Any], prefix: str = "") -> str:
    text = ""
    for name, table in tables.items():
        keys = {k: v for k, v in table.items() if not isinstance(v, dict)}
        text += f"[{prefix}{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in keys.items())
        inner = {k: v for k, v in table.items() if isinstance(v, dict)}
        text += _tables(inner, f"{prefix}{name}.")
    return text


def workspace(root: Path, model_dir: Path, settings: str = "") -> Path:
    """A project with the tiny rollout, six rows and ``configs/training/tiny.toml``
    (`config_text` of ``settings``)."""
    shutil.copytree(PROJECT, root)
    (root / "data").mkdir()
    write_rows(root)
    config = root / "configs" / "training" / "tiny.toml"
    config.parent.mkdir(parents=True)
    config.write_text(config_text(model_dir, settings))
    return config


async def start(
    config: Path, *args: str, env: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    """``osmosis train run config *args`` in the project, with this environment and ``env``."""
    return await asyncio.create_subprocess_exec(
        OSMOSIS, "train", "run", str(config), *args,
        cwd=config.parents[2],
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip


async def run(config: Path, *args: str, limit_sec: float = 120) -> tuple[int, str]:
    process = await start(config, *args)
    out, _ = await communicate_within(process, limit_sec)
    assert process.returncode is not None
    return process.returncode, out.decode()


async def train_here(config: Path, overrides: tuple[str, ...] = ()) -> TrainOutcome:
    """The run in this process: no CLI start-up (torch, transformers), so seconds faster."""
    return await run_training(TrainOptions(config_path=config, overrides=overrides))


def text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def kill_once_written(config: Path, path: Path, marker: str) -> None:
    """Start ``osmosis train run`` on ``config`` and SIGKILL it once ``path`` holds ``marker``."""
    process = await start(config)
    try:
        async with asyncio.timeout(120):
            while marker not in text(path):  # noqa: ASYNC110 -- another process writes it
                await asyncio.sleep(0.02)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        await process.wait()
