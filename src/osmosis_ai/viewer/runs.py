"""What the viewer reads from eval run directories. Blocking file I/O: call off the loop.

A run directory is what ``osmosis eval run`` writes (``manifest.json``, ``events.jsonl``,
``metrics.json``, ``rollout_trials/<rollout_id>/``, ``previews/<rollout_id>/preview.json``).
Every path the viewer opens is built from a validated name under the root it was given;
nothing outside it is ever read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from osmosis_ai.eval.journal import read_records
from osmosis_ai.eval.metrics import index_rows, pass_at_k_points
from osmosis_ai.eval.run_dir import MANIFEST, PREVIEWS_DIR
from osmosis_ai.rollout.status import TERMINAL_STATUSES
from osmosis_ai.rollout.trajectory.preview import PREVIEW_FILENAME, preview_id_allowed

__all__ = [
    "ViewerRoot",
    "artifact_file",
    "live_previews",
    "rollout_detail",
    "run_items",
    "run_overview",
    "run_summaries",
]

_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
_TRIALS = "rollout_trials"
_TERMINAL = frozenset(status.value for status in TERMINAL_STATUSES)
_MAX_JSON_BYTES = 64 * 1024 * 1024


def _unlinked(path: Path, top: Path) -> bool:
    """Whether no component of ``path`` below ``top`` (``path`` included) is a symlink.

    A workflow can replace its artifacts directory, or anything under its rollout's
    directory, with a link to anywhere; the viewer must not follow it.
    """
    for part in (path, *path.parents):
        if part == top:
            return True
        if part.is_symlink():
            return False
    return False  # not under top at all


def _read_json(path: Path, top: Path) -> Any:
    """A JSON file's content, or ``None`` when it is missing, linked, too big or not JSON."""
    try:
        if not _unlinked(path, top) or not path.is_file():
            return None
        if path.stat().st_size > _MAX_JSON_BYTES:
            return None
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


class ViewerRoot:
    """The directory the viewer shows: one run directory, or a folder of them."""

    def __init__(self, path: Path) -> None:
        self.path = path.resolve()

    def runs(self) -> list[Path]:
        """Run directories, newest first."""
        if (self.path / MANIFEST).is_file():
            return [self.path]
        try:
            candidates = [
                p for p in self.path.iterdir() if not p.is_symlink() and (p / MANIFEST).is_file()
            ]
        except OSError:
            return []
        return sorted(candidates, key=lambda p: (p / MANIFEST).stat().st_mtime, reverse=True)

    def run(self, name: str) -> Path | None:
        """The run directory called ``name``, or ``None`` when there is no such run."""
        if _RUN_NAME.fullmatch(name) is None:
            return None
        return next((run for run in self.runs() if run.name == name), None)


def _status(run_dir: Path, metrics: Any) -> str:
    if isinstance(metrics, dict):
        status = (metrics.get("eval_run") or {}).get("status")
        if isinstance(status, str):
            return status
    return "running" if (run_dir / "events.jsonl").exists() else "created"


def run_summaries(root: ViewerRoot) -> list[dict[str, Any]]:
    """One line per run for the runs page."""
    out = []
    for run_dir in root.runs():
        manifest = _read_json(run_dir / MANIFEST, run_dir) or {}
        metrics = _read_json(run_dir / "metrics.json", run_dir)
        inputs = manifest.get("inputs") or {}
        summary = (metrics or {}).get("summary") or {}
        out.append(
            {
                "name": run_dir.name,
                "created_at": manifest.get("created_at"),
                "model": inputs.get("model_path"),
                "rollout": (inputs.get("rollout") or {}).get("name"),
                "status": _status(run_dir, metrics),
                "total_samples": summary.get("total_samples"),
                "pass_rate": summary.get("pass_rate"),
                "mean_reward": (summary.get("reward_stats") or {}).get("mean"),
            }
        )
    return out


def _rows(run_dir: Path) -> list[Any]:
    records = read_records(run_dir / "events.jsonl")
    trials = run_dir / _TRIALS
    names = {
        record.rollout_id: "trajectory.json"
        for record in records.values()
        if (trials / record.rollout_id / "trajectory.json").is_file()
    }
    return index_rows(records, resumed_keys=set(), trajectory_filenames=names)


def run_items(run_dir: Path) -> list[dict[str, Any]]:
    """The run's work items, from its journal (so also while the run is going on)."""
    return [row.to_json() for row in _rows(run_dir)]


def run_overview(run_dir: Path) -> dict[str, Any]:
    """The run page's header: manifest inputs, metrics and pass@k."""
    manifest = _read_json(run_dir / MANIFEST, run_dir) or {}
    metrics = _read_json(run_dir / "metrics.json", run_dir)
    summary = (metrics or {}).get("summary") or {}
    threshold = summary.get("pass_threshold")
    if not isinstance(threshold, int | float):
        threshold = 1.0
    return {
        "name": run_dir.name,
        "status": _status(run_dir, metrics),
        "created_at": manifest.get("created_at"),
        "inputs": manifest.get("inputs") or {},
        "summary": summary,
        "pass_threshold": threshold,
        "pass_at_k": pass_at_k_points(_rows(run_dir), pass_threshold=float(threshold)),
    }


def _artifacts(directory: Path) -> list[dict[str, Any]]:
    if not directory.is_dir() or directory.is_symlink():
        return []
    found = []
    for path in sorted(directory.rglob("*")):
        if path.is_file() and _unlinked(path, directory):
            found.append(
                {"path": path.relative_to(directory).as_posix(), "size": path.stat().st_size}
            )
        if len(found) >= 1000:
            break
    return found


def rollout_detail(run_dir: Path, rollout_id: str) -> dict[str, Any] | None:
    """A rollout's trajectory, diagnostics, artifact list and latest preview."""
    if not preview_id_allowed(rollout_id):
        return None
    trial = run_dir / _TRIALS / rollout_id
    preview = _read_json(run_dir / PREVIEWS_DIR / rollout_id / PREVIEW_FILENAME, run_dir)
    if not trial.is_dir() and preview is None:
        return None
    artifacts = trial / "artifacts"
    return {
        "rollout_id": rollout_id,
        "trajectory": _read_json(trial / "trajectory.json", run_dir),
        "diagnostics": _read_json(trial / "diagnostics.json", run_dir),
        "artifacts": _artifacts(artifacts) if _unlinked(artifacts, run_dir) else [],
        "preview": preview,
    }


def artifact_file(run_dir: Path, rollout_id: str, relative: str) -> Path | None:
    """The artifact file at ``relative`` inside the rollout's artifacts directory, or ``None``.

    Refuses absolute paths, ``..`` parts, links and anything that resolves outside.
    """
    if not preview_id_allowed(rollout_id) or not relative:
        return None
    parts = relative.split("/")
    if relative.startswith("/") or "\\" in relative or any(p in ("", ".", "..") for p in parts):
        return None
    base = run_dir / _TRIALS / rollout_id / "artifacts"
    candidate = base.joinpath(*parts)
    if not _unlinked(candidate, run_dir) or not candidate.is_file():
        return None
    return candidate


def _preview_meta(document: Any) -> dict[str, Any] | None:
    """The ``extra.osmosis`` object of a well-formed preview document, else ``None``."""
    if not isinstance(document, dict) or not isinstance(document.get("steps"), list):
        return None
    extra = document.get("extra")
    meta = extra.get("osmosis") if isinstance(extra, dict) else None
    return meta if isinstance(meta, dict) else None


def live_previews(run_dir: Path) -> list[dict[str, Any]]:
    """Previews of the run's rollouts still in flight, newest first.

    A preview whose rollout already has a journal record is over even if its last
    publication never said so (a killed server, a rollout the runner gave up on).
    """
    directory = run_dir / PREVIEWS_DIR
    if not directory.is_dir() or not _unlinked(directory, run_dir):
        return []
    finished = {record.rollout_id for record in read_records(run_dir / "events.jsonl").values()}
    live = []
    for child in directory.iterdir():
        if not preview_id_allowed(child.name) or child.name in finished:
            continue
        document = _read_json(child / PREVIEW_FILENAME, run_dir)
        meta = _preview_meta(document)
        if meta is not None and meta.get("status") not in _TERMINAL:
            live.append(document)
    live.sort(key=lambda d: str(d["extra"]["osmosis"].get("updated_at")), reverse=True)
    return live
