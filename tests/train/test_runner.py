"""`osmosis train run` end to end: a real CLI subprocess, rollout server and tiny model."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.train.config import load_train_config
from osmosis_ai.train.runner import split_rows, step_rows

PROJECT = Path(__file__).resolve().parent / "project"
OSMOSIS = str(Path(sys.executable).with_name("osmosis"))

pytestmark = pytest.mark.slow


def _write_rows(root: Path, **metadata: object) -> None:
    rows = [{"user_prompt": f"count to {i}", "ground_truth": str(i), **metadata} for i in range(6)]
    (root / "data" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _workspace(root: Path, model_dir: Path, training: str) -> Path:
    """A project with the tiny rollout, six rows and ``configs/training/tiny.toml``."""
    shutil.copytree(PROJECT, root)
    (root / "data").mkdir()
    _write_rows(root)
    config = root / "configs" / "training" / "tiny.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        "[experiment]\n"
        'rollout = "tiny"\nentrypoint = "main.py"\n'
        f'model = "{model_dir}"\ndataset = "data/rows.jsonl"\n'
        "[training]\nprompts_per_step = 2\ngroup_size = 3\neval_rows = 2\nmax_tokens = 8\n"
        f"learning_rate = 0.001\ntoken_budget = 2048\n{training}\n"
    )
    return config


async def _start(config: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        OSMOSIS, "train", "run", str(config),
        cwd=config.parents[2],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip


async def _run(config: Path, limit_sec: float = 120) -> tuple[int, str]:
    process = await _start(config)
    async with asyncio.timeout(limit_sec):
        out, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode()


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_train_run_writes_metrics_evals_a_checkpoint_and_no_secret(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "tiny-secret-value-0123456789"
    monkeypatch.setenv("TINY_SECRET", secret)  # the child inherits it
    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 2\ncheckpoint_every = 2")
    config.write_text(config.read_text() + '[secrets]\nrequired = ["TINY_SECRET"]\n')
    _write_rows(tmp_path / "ws", metadata={"leak": True})  # key and secret in every output
    code, out = await _run(config)
    assert code == 0, out
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    assert "debug " in (run_dir / "logs.txt").read_text(), "the rollout's output is logged"
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "notes.txt" for p in files), "the rollout's artifacts are kept"
    for path in files:
        assert secret.encode() not in path.read_bytes(), path
    assert secret not in out
    metrics = _lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for line in metrics:
        assert isinstance(line["loss"], float) and math.isfinite(line["loss"]), line
        assert line["tokens_generated"] > 0 and line["tokens_trained"] > 0
    events = _lines(run_dir / "events.jsonl")
    assert [e["step"] for e in events if e["event"] == "eval"] == [0, 2]
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [2]
    checkpoint = run_dir / "checkpoints" / "step-0002"
    assert (checkpoint / "config.json").is_file() and (checkpoint / "trainer.pt").is_file()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-0002"]
    assert any((run_dir / "rollouts").rglob("*.json")), "the rollouts' files stay in the run"
    assert "step 1: reward" in out and "step 2: reward" in out
    assert "before" in out and "after" in out


async def test_resume_after_sigkill_applies_no_step_twice(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 3\ncheckpoint_every = 1")
    events = tmp_path / "ws" / ".osmosis" / "train" / "tiny" / "events.jsonl"
    process = await _start(config)
    try:
        async with asyncio.timeout(120):
            while '"checkpoint"' not in _text(events):  # noqa: ASYNC110 -- another process writes it
                await asyncio.sleep(0.1)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        await process.wait()
    killed_at = [e for e in _lines(events) if e["event"] == "checkpoint"]
    assert killed_at and killed_at[-1]["step"] < 3
    code, out = await _run(config)
    assert code == 0, out
    assert f"resuming after step {killed_at[-1]['step']}" in out
    metrics = _lines(events.with_name("metrics.jsonl"))
    assert [m["step"] for m in metrics] == [1, 2, 3]
    checkpoints = [e["step"] for e in _lines(events) if e["event"] == "checkpoint"]
    assert checkpoints == sorted(set(checkpoints)) and checkpoints[-1] == 3


async def test_rollout_server_dying_mid_step_leaves_the_step_unapplied(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 2\ncheckpoint_every = 1")
    # 2 held-out + 6 step-1 rollouts come first: the 10th is inside step 2.
    _write_rows(tmp_path / "ws", metadata={"die_at": 10, "counter": str(tmp_path / "count")})
    code, out = await _run(config)
    assert code == 1, out
    assert "step 2 was not applied, the last checkpoint is step 1" in out
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    assert [m["step"] for m in _lines(run_dir / "metrics.jsonl")] == [1]
    _write_rows(tmp_path / "ws")  # the server survives now: the same command resumes
    code, out = await _run(config)
    assert code == 0, out
    assert "resuming after step 1" in out
    assert [m["step"] for m in _lines(run_dir / "metrics.jsonl")] == [1, 2]


async def test_non_finite_step_stops_the_run_and_keeps_the_checkpoint(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    # A learning rate this large makes the weights infinite after step 1: step 2's loss is not.
    training = "steps = 3\ncheckpoint_every = 1\nlearning_rate = 1e30"
    config = _workspace(tmp_path / "ws", tiny_model_dir, training)
    config.write_text(config.read_text().replace("learning_rate = 0.001\n", ""))
    code, out = await _run(config)
    assert code == 1, out
    assert "step 2 was not applied, the last checkpoint is step 1" in out
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    assert (run_dir / "checkpoints" / "step-0001" / "trainer.pt").is_file()
    stopped = [e for e in _lines(run_dir / "events.jsonl") if e["event"] == "stopped"]
    assert [e["step"] for e in stopped] == [2]


def test_unknown_training_key_is_named_with_its_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "stepz = 3")
    lines = config.read_text().splitlines()
    with pytest.raises(ConfigError) as error:
        load_train_config(config)
    assert f"line {lines.index('stepz = 3') + 1}" in str(error.value)
    assert "training.stepz" in str(error.value)


def test_bad_training_values_name_the_key(tmp_path: Path, tiny_model_dir: Path) -> None:
    for bad, key in (
        ("steps = 0", "training.steps"),
        ('normalisation = "mean"', "training.normalisation"),
        ("kl_beta = true", "training.kl_beta"),
        ("temperature = -1", "training.temperature"),
    ):
        config = _workspace(tmp_path / bad.split()[0], tiny_model_dir, bad)
        with pytest.raises(ConfigError, match=key):
            load_train_config(config)


async def test_cli_reports_a_config_error_on_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "[extra]\nx = 1")
    code, out = await _run(config, limit_sec=60)
    assert code == 2
    line = config.read_text().splitlines().index("[extra]") + 1
    assert out.strip().count("\n") == 0 and f"line {line}: unknown section or key 'extra'" in out


def test_held_out_split_is_seeded_disjoint_and_sized_by_count_or_fraction() -> None:
    train, held = split_rows(10, 3, seed=1)
    assert len(held) == 3 and sorted(train + held) == list(range(10))
    assert split_rows(10, 3, seed=1) == (train, held)
    assert split_rows(10, 3, seed=2) != (train, held)
    assert len(split_rows(10, 0.25, seed=0)[1]) == 2  # a fraction of the rows, rounded
    with pytest.raises(ConfigError, match="training.eval_rows"):
        split_rows(4, 4, seed=0)


def test_step_rows_depend_on_seed_and_step_only() -> None:
    rows = list(range(20))
    first = step_rows(rows, 4, seed=0, step=3)
    assert len(set(first)) == 4 and set(first) <= set(rows)
    assert step_rows(rows, 4, seed=0, step=3) == first  # a resumed run picks the same rows
    assert step_rows(rows, 4, seed=0, step=4) != first
    assert sorted(step_rows(rows[:3], 4, seed=0, step=1)) == rows[:3]
