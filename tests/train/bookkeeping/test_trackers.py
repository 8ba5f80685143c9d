"""`[tracking] report_to`: the real tracker packages, fully offline, read back from their files.

The run is a real `osmosis train run` subprocess on the tiny model: two steps, then a resume
to a third, which must continue the same tracker runs.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.eval.metrics import pass_at_k
from osmosis_ai.train.bookkeeping.trackers import flat_params, scalars
from osmosis_ai.train.config import load_train_config
from osmosis_ai.train.loop.runner import held_out_pass_at_k
from tests.train.runs.test_runner import run_without
from tests.train.training_project import lines as _lines
from tests.train.training_project import run as _run
from tests.train.training_project import workspace as _workspace

pytestmark = pytest.mark.slow  # left out of make test-fast

FAKE_WANDB_KEY = "wandb-key-0123456789abcdef0123456789abcdef01234567"


def test_scalars_flatten_tables_and_keep_only_numbers() -> None:
    line = {
        "step": 3,
        "loss": 0.5,
        "tokens": 12,
        "kl": None,
        "ok": True,
        "name": "x",
        "excluded": {"length": 2, "deep": {"a": 1.5}},
    }
    assert scalars(line) == {
        "loss": 0.5,
        "tokens": 12.0,
        "excluded/length": 2.0,
        "excluded/deep/a": 1.5,
    }


def test_flat_params_name_nested_settings_with_dots() -> None:
    params = {"model": "m", "training": {"steps": 3, "report_to": ["wandb"], "x": None}}
    assert flat_params(params) == {
        "model": "m",
        "training.steps": "3",
        "training.report_to": '["wandb"]',
        "training.x": "null",
    }


def test_held_out_pass_at_k_averages_the_unbiased_estimate_over_rows() -> None:
    # Two rows of three samples: one passes once, the other never.
    passed = [False, True, False, False, False, False]
    values = held_out_pass_at_k(passed, 3)
    assert list(values) == [1, 2, 3]
    for k in (1, 2, 3):
        assert values[k] == pytest.approx((pass_at_k(3, 1, k) + pass_at_k(3, 0, k)) / 2)
    assert values[1] == pytest.approx(1 / 6) and values[3] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ('[tracking]\nreport_to = ["neptune"]', "tracking.report_to: unknown tracker 'neptune'"),
        ('[tracking]\nreport_to = "wandb"', "tracking.report_to must be an array of tracker"),
        ("[eval]\nsamples = 0", "eval.samples must be positive"),
        ("[eval]\nsamples = 4", r"eval.samples > 1 needs temperature > 0"),
    ],
)
def test_bad_tracker_and_sample_settings_name_the_key(
    tmp_path: Path, tiny_model_dir: Path, setting: str, message: str
) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, setting)
    with pytest.raises(ConfigError, match=message):
        load_train_config(config)


def _wandb_records(path: Path) -> list[Any]:
    """The records of a W&B run file (LevelDB's log format: 32 KiB blocks of chunks with a
    7-byte header, after the file's own 7-byte header)."""
    from wandb.proto import wandb_internal_pb2

    data, position, pending, records = path.read_bytes(), 7, b"", []
    block = 32768
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # the block's tail is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if length == 0 and kind == 0:
            position += left
            continue
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _wandb_history(run_dir: Path) -> tuple[set[str], list[dict[str, float]]]:
    """The run ids and the logged rows of every W&B session of the run."""
    ids, rows = set(), []
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
            elif kind == "history":
                items = record.history.item
                rows.append({"/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return ids, rows


def _tensorboard(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
        EventAccumulator,
    )

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def _read_in_child(code: str, **env: str) -> Any:
    """What ``code`` prints as JSON, run in a fresh interpreter (the trackers keep their
    settings in module state read at import)."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env={**env, "PATH": "/usr/bin:/bin"},
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.whole_run
async def test_every_tracker_gets_steps_evals_and_settings_and_a_resume_continues_them(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trackio_dir = tmp_path / "trackio"
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_API_KEY": FAKE_WANDB_KEY,
        "TRACKIO_DIR": str(trackio_dir),
        "HF_HUB_OFFLINE": "1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the workspace's SQLite store
    setting = '[tracking]\nreport_to = ["tensorboard", "wandb", "mlflow", "trackio"]\n'
    config = _workspace(tmp_path / "ws", tiny_model_dir, f"steps = 2\n[eval]\nevery = 1\n{setting}")
    code, out = await _run(config, limit_sec=240)
    assert code == 0, out
    code, out_resumed = await _run(config, "--set", "training.steps=3", limit_sec=240)
    assert code == 0, out_resumed
    assert "resuming after step 2" in out_resumed
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    metrics = {line["step"]: line for line in _lines(run_dir / "metrics.jsonl")}
    assert sorted(metrics) == [1, 2, 3]
    evals = {e["step"]: e for e in _lines(run_dir / "events.jsonl") if e["event"] == "eval"}
    assert sorted(evals) == [0, 1, 2, 3]

    # TensorBoard: every number of every metrics line, and the evaluations, at their steps.
    board = _tensorboard(run_dir)
    for step, line in metrics.items():
        for name, number in scalars(line).items():
            logged = [v for s, v in board[name] if s == step]  # float32 in the event file
            assert logged and math.isclose(logged[-1], number, rel_tol=1e-5), (name, step)
    assert [s for s, _ in board["eval/mean_reward"]] == [0, 1, 2, 3]

    # W&B, offline: one run id across both sessions, every step once under its own axis.
    ids, rows = _wandb_history(run_dir)
    assert ids == {json.loads((run_dir / "trackers.json").read_text())["wandb"]}
    steps = [row["train/step"] for row in rows if "loss" in row or "reward_mean" in row]
    assert steps == [1, 2, 3]
    eval_steps = [row["train/step"] for row in rows if "eval/pass_rate" in row]
    assert eval_steps == [0, 1, 2, 3]

    # MLflow, the workspace's SQLite store: one run, the settings as its parameters.
    store = f"sqlite:///{tmp_path / 'ws' / '.osmosis' / 'mlflow.db'}"
    run_id = json.loads((run_dir / "trackers.json").read_text())["mlflow"]
    mlflow = _read_in_child(
        "import json, mlflow\n"
        f"c = mlflow.MlflowClient({store!r})\n"
        f"run = c.get_run({run_id!r})\n"
        "runs = c.search_runs([run.info.experiment_id])\n"
        f"h = c.get_metric_history({run_id!r}, 'eval/mean_reward')\n"
        "print(json.dumps({'runs': len(runs), 'name': run.info.run_name, "
        "'status': run.info.status, 'params': run.data.params, "
        "'evals': sorted((m.step, m.value) for m in h)}))",
    )
    assert mlflow["runs"] == 1 and mlflow["name"] == "tiny" and mlflow["status"] == "FINISHED"
    assert mlflow["params"]["learner.learning_rate"] == "0.001"
    assert mlflow["params"]["tracking.report_to"] == json.dumps(
        ["tensorboard", "wandb", "mlflow", "trackio"]
    )
    assert [step for step, _ in mlflow["evals"]] == [0, 1, 2, 3]
    for step, value in mlflow["evals"]:
        assert math.isclose(value, evals[step]["mean_reward"])

    # Trackio, in its local directory: one run that got every step.
    trackio = _read_in_child(
        "import json\n"
        "from trackio.sqlite_storage import SQLiteStorage as S\n"
        "logs = S.get_logs('osmosis', 'tiny')\n"
        "print(json.dumps({'runs': S.get_runs('osmosis'), "
        "'steps': sorted({l['step'] for l in logs if 'loss' in l})}))",
        TRACKIO_DIR=str(trackio_dir),
        HF_HUB_OFFLINE="1",
    )
    assert trackio["runs"] == ["tiny"] and trackio["steps"] == [1, 2, 3]

    # No tracker's credential anywhere the run wrote, nor in its output.
    for path in (p for p in run_dir.rglob("*") if p.is_file()):
        assert FAKE_WANDB_KEY.encode() not in path.read_bytes(), path
    assert FAKE_WANDB_KEY not in out + out_resumed


async def test_a_missing_tracker_stops_the_run_before_anything_starts(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    setting = 'steps = 1\n[tracking]\nreport_to = ["wandb"]'
    out = await run_without("wandb", tmp_path, tiny_model_dir, setting, monkeypatch)
    assert "missing 'wandb'" in out and "pip install 'osmosis-ai[track]'" in out


async def test_a_tracker_that_cannot_start_is_one_line_naming_the_fix(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An MLflow store that cannot be opened: a URI scheme no store serves.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://nowhere")
    config = _workspace(
        tmp_path / "ws", tiny_model_dir, 'steps = 1\n[tracking]\nreport_to = ["mlflow"]'
    )
    code, out = await _run(config, limit_sec=120)
    assert code == 2 and out.strip().splitlines()[-1].startswith("error: report_to mlflow"), out
    assert "check MLFLOW_TRACKING_URI" in out and "Traceback" not in out


@pytest.mark.whole_run
async def test_several_samples_per_held_out_row_report_pass_at_k(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    setting = "steps = 1\n[eval]\nsamples = 3\ntemperature = 1.0"
    config = _workspace(tmp_path / "ws", tiny_model_dir, setting)
    code, out = await _run(config, limit_sec=180)
    assert code == 0, out
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    ids = [
        line["rollout_id"]
        for line in _lines(run_dir / "rollouts.jsonl")
        if line["rollout_id"].startswith("eval-0000-")
    ]
    assert len(ids) == 2 * 3 and len(set(ids)) == 6, ids  # 2 held-out rows x 3 samples
    for event in (e for e in _lines(run_dir / "events.jsonl") if e["event"] == "eval"):
        at_k = event["pass_at_k"]
        assert list(at_k) == ["1", "2", "3"]
        assert at_k["1"] == pytest.approx(event["pass_rate"])
        assert at_k["1"] <= at_k["2"] <= at_k["3"]
    assert "pass@3" in out
