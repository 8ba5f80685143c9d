"""Files rebuilt from the journal after (or while leaving) a run: index, metrics, copies."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis_ai.eval.datasets import Dataset
from osmosis_ai.eval.files import copy_artifacts, write_json_atomic, write_jsonl_atomic
from osmosis_ai.eval.journal import JournalRecord
from osmosis_ai.eval.metrics import IndexRow, index_rows, summarize

__all__ = ["Projections", "write_projections"]

Item = tuple[int, int]


@dataclass
class Projections:
    """What the rebuilt files say about the run."""

    metrics: dict[str, Any]
    complete: bool
    failed_rows: list[dict[str, Any]] = field(default_factory=list)


def _trajectory_identity(path: Path) -> str | None:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    osmosis = (document.get("extra") or {}).get("osmosis") or {}
    identity = osmosis.get("rollout_id") or document.get("session_id")
    if identity is None and isinstance(document.get("trajectory_id"), str):
        identity = document["trajectory_id"].split("/", 1)[0]
    return identity if isinstance(identity, str) else None


def write_projections(
    run_dir: Path,
    *,
    manifest: Mapping[str, Any],
    records: Mapping[Item, JournalRecord],
    items: list[Item],
    dataset: Dataset,
    resumed_keys: Set[Item],
    pass_threshold: float,
    model_name: str,
    rollout_name: str,
) -> Projections:
    """Rebuild ``index.jsonl``, ``summary.jsonl``, ``progress.json``, ``metrics.json``,
    ``trajectories/`` and ``artifacts/`` of ``run_dir`` from the journal (synchronous I/O)."""
    trials = run_dir / "rollout_trials"
    filenames = _trajectory_filenames(trials, records)
    rows = index_rows(records, resumed_keys=resumed_keys, trajectory_filenames=filenames)
    lines = [row.to_json() for row in rows]
    write_jsonl_atomic(run_dir / "index.jsonl", lines)
    write_jsonl_atomic(run_dir / "summary.jsonl", lines)
    write_json_atomic(
        run_dir / "progress.json",
        {
            "total_runs": len(items),
            "sampled_rows": len(dataset.items),
            "total_dataset_rows": dataset.total_rows,
        },
    )
    complete = all(item in records for item in items)
    eval_run: dict[str, Any] = {
        "id": manifest["local_run_id"],
        "status": "finished" if complete else "incomplete",
        "name": run_dir.name,
        "dataset_name": dataset.path.name,
        "model_name": model_name,
        "rollout_name": rollout_name,
        "started_at": manifest["created_at"],
    }
    if complete:
        eval_run["completed_at"] = dt.datetime.now(dt.UTC).isoformat()
    metrics = {"eval_run": eval_run, "summary": summarize(rows, pass_threshold=pass_threshold)}
    write_json_atomic(run_dir / "metrics.json", metrics)
    _copy_selected(run_dir, rows, filenames)
    return Projections(metrics=metrics, complete=complete, failed_rows=_failed_rows(trials, rows))


def _trajectory_filenames(trials: Path, records: Mapping[Item, JournalRecord]) -> dict[str, str]:
    """rollout_id -> trajectory file name, for the rollouts whose trajectory is their own."""
    filenames: dict[str, str] = {}
    for record in records.values():
        if (
            _trajectory_identity(trials / record.rollout_id / "trajectory.json")
            == record.rollout_id
        ):
            filenames[record.rollout_id] = "trajectory.json"
    return filenames


def _failed_rows(trials: Path, rows: list[IndexRow]) -> list[dict[str, Any]]:
    return [
        {
            "row_index": row.row_index,
            "source_row_index": row.source_row_index,
            "run_index": row.run_index,
            "rollout_id": row.rollout_id,
            "error_type": row.error_type,
            "error_message": row.error_message,
            # Only a rollout the server ran has a folder (not one refused at admission).
            "rollout_dir": str(trials / row.rollout_id)
            if (trials / row.rollout_id).is_dir()
            else None,
        }
        for row in rows
        if row.status == "failed"
    ]


def _copy_selected(run_dir: Path, rows: list[Any], filenames: Mapping[str, str]) -> None:
    trials = run_dir / "rollout_trials"
    trajectories = run_dir / "trajectories"
    artifacts = run_dir / "artifacts"
    trajectories.mkdir(exist_ok=True)
    artifacts.mkdir(exist_ok=True)
    for row in rows:
        stem = f"row_{row.row_index}_run_{row.run_index}"
        target = trajectories / f"{stem}.json"
        if row.rollout_id in filenames:
            shutil.copyfile(trials / row.rollout_id / "trajectory.json", target)
        else:
            target.unlink(missing_ok=True)  # a retried item must not keep a stale copy
        source = trials / row.rollout_id / "artifacts"
        if source.is_symlink() or not source.is_dir():
            shutil.rmtree(artifacts / stem, ignore_errors=True)
            continue
        copy_artifacts(source, artifacts / stem)
