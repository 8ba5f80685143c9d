"""Where the viewer finds runs, and what it reads from eval run directories (training runs:
``training.py``). Blocking file I/O: call off the loop.

An eval run directory is what ``osmosis eval run`` writes (``manifest.json``, ``events.jsonl``,
``metrics.json``, ``rollout_trials/<rollout_id>/``, ``previews/<rollout_id>/preview.json``).
Every path the viewer opens is built from a validated name under the root it was given;
nothing outside it is ever read.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis_ai.eval.journal import JournalCorruptError, JournalRecord, WorkItem, read_records
from osmosis_ai.eval.metrics import IndexRow, index_rows, pass_at_k_points, summarize
from osmosis_ai.eval.run_dir import GROUP_JUDGE_FILE, MANIFEST, PREVIEWS_DIR
from osmosis_ai.rollout.status import TERMINAL_STATUSES
from osmosis_ai.rollout.trajectory.preview import PREVIEW_FILENAME, preview_id_allowed

__all__ = [
    "EVAL_RUN",
    "TRAIN_RUN",
    "TRIALS",
    "RunKind",
    "RunUnreadableError",
    "ViewerRoot",
    "artifact_file",
    "live_previews",
    "read_json_lines",
    "rollout_detail",
    "run_items",
    "run_overview",
    "run_summaries",
]

_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
#: Where an eval run keeps its rollouts' files.
TRIALS = "rollout_trials"
_JOURNAL = "events.jsonl"
_METRICS = "metrics.json"
_TERMINAL = frozenset(status.value for status in TERMINAL_STATUSES)
_MAX_JSON_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class RunKind:
    """How a kind of run directory is recognised: it holds ``marker`` and not ``unless``."""

    marker: str
    unless: str | None = None

    def holds(self, path: Path) -> bool:
        """Whether ``path`` is a run directory of this kind."""
        if self.unless is not None and (path / self.unless).exists():
            return False
        return (path / self.marker).is_file()


#: ``osmosis eval run``'s directories: the manifest is written first.
EVAL_RUN = RunKind(MANIFEST)
#: ``osmosis train run``'s directories: a journal and no manifest.
TRAIN_RUN = RunKind(_JOURNAL, unless=MANIFEST)


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


def read_json_lines(path: Path, top: Path) -> list[dict[str, Any]]:
    """The JSON objects of a ``.jsonl`` file (none when it is missing, linked or too big).

    A run being written may end in half a line: the last line is skipped when it does not
    parse. Any other bad line makes the file unreadable.

    Raises:
        RunUnreadableError: A line before the last is not a JSON object.
    """
    try:
        if not _unlinked(path, top) or not path.is_file():
            return []
        if path.stat().st_size > _MAX_JSON_BYTES:
            return []
        lines = path.read_bytes().splitlines()
    except OSError:
        return []
    parsed: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        try:
            value = json.loads(line)
        except ValueError:
            value = None
        if isinstance(value, dict):
            parsed.append(value)
        elif number < len(lines):
            raise RunUnreadableError(f"{path.name} line {number} is not a JSON object")
    return parsed


class ViewerRoot:
    """The directory the viewer shows: one run directory, a folder of them, or a workspace's
    ``.osmosis`` folder (its ``evals/`` and ``train/`` folders)."""

    def __init__(self, path: Path) -> None:
        self.path = path.resolve()

    def _find(self, kind: RunKind) -> list[Path]:
        """Run directories of ``kind``, newest first."""
        if kind.holds(self.path):
            return [self.path]
        found = []
        for folder in (self.path, self.path / "evals", self.path / "train"):
            if folder != self.path and folder.is_symlink():
                continue  # it could lead anywhere: the viewer reads only under its path
            try:
                children = list(folder.iterdir())
            except OSError:
                continue
            found += [p for p in children if not p.is_symlink() and kind.holds(p)]
        return sorted(found, key=lambda p: _mtime(p / kind.marker), reverse=True)

    def runs(self) -> list[Path]:
        """Eval run directories, newest first."""
        return self._find(EVAL_RUN)

    def train_runs(self) -> list[Path]:
        """Training run directories, most recently active first."""
        return self._find(TRAIN_RUN)

    def run(self, name: str, kind: RunKind | None = None) -> Path | None:
        """The run directory of ``kind`` (eval by default) called ``name``, or ``None``."""
        if _RUN_NAME.fullmatch(name) is None:
            return None
        return next((run for run in self._find(kind or EVAL_RUN) if run.name == name), None)


class RunUnreadableError(Exception):
    """A run directory's files cannot be read as a run (damaged or edited by hand).

    The message says which file and what is wrong with it.
    """


def _object(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (a missing optional part)."""
    return value if isinstance(value, dict) else {}


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0  # removed since it was listed: sorts last, then reads as unreadable


@dataclass(frozen=True)
class _Run:
    """What the viewer shows of a run, all from one read of its files."""

    manifest: dict[str, Any]
    status: str
    rows: list[IndexRow]
    summary: dict[str, Any]
    pass_threshold: float


def _load(run_dir: Path) -> _Run:
    """Read a run directory.

    The summary is computed from the journal, as the charts are, so that it is there while
    the run goes on (``metrics.json`` is written at its end); only the pass threshold,
    which the journal does not hold, comes from ``metrics.json`` (1.0 until it exists).

    Raises:
        RunUnreadableError: The manifest, metrics or journal cannot be read.
    """
    manifest = _read_json(run_dir / MANIFEST, run_dir)
    if not isinstance(manifest, dict):
        raise RunUnreadableError(f"{MANIFEST} is not a readable JSON object")
    metrics: dict[str, Any] = {}
    if (run_dir / _METRICS).exists():
        document = _read_json(run_dir / _METRICS, run_dir)
        if not isinstance(document, dict) or not all(
            isinstance(document.get(key, {}), dict) for key in ("eval_run", "summary")
        ):
            raise RunUnreadableError(
                f"{_METRICS} is not a readable JSON object with 'eval_run' and 'summary' objects"
            )
        metrics = document
    rows = _rows(run_dir)
    found = _object(metrics.get("summary")).get("pass_threshold")
    threshold = 1.0
    if isinstance(found, int | float) and not isinstance(found, bool) and math.isfinite(found):
        threshold = float(found)
    status = _object(metrics.get("eval_run")).get("status")
    if not isinstance(status, str):
        status = "running" if (run_dir / _JOURNAL).exists() else "created"
    return _Run(
        manifest=manifest,
        status=status,
        rows=rows,
        # No item yet: nothing to summarize (not a 0% pass rate).
        summary=summarize(rows, pass_threshold=threshold) if rows else {},
        pass_threshold=threshold,
    )


def run_summaries(root: ViewerRoot) -> list[dict[str, Any]]:
    """One line per run for the runs page; a run that cannot be read is ``broken``, with
    its ``problem``, and does not hide the others."""
    out: list[dict[str, Any]] = []
    for run_dir in root.runs():
        try:
            run = _load(run_dir)
        except RunUnreadableError as exc:
            out.append({"name": run_dir.name, "status": "broken", "problem": str(exc)})
            continue
        inputs = _object(run.manifest.get("inputs"))
        out.append(
            {
                "name": run_dir.name,
                "created_at": run.manifest.get("created_at"),
                "model": inputs.get("model_path"),
                "rollout": _object(inputs.get("rollout")).get("name"),
                "status": run.status,
                "total_samples": run.summary.get("total_samples"),
                "pass_rate": run.summary.get("pass_rate"),
                "mean_reward": _object(run.summary.get("reward_stats")).get("mean"),
            }
        )
    return out


def _journal(run_dir: Path) -> dict[WorkItem, JournalRecord]:
    """The run's journal records (``RunUnreadableError`` when it cannot be read)."""
    try:
        return read_records(run_dir / _JOURNAL)
    except JournalCorruptError as exc:
        raise RunUnreadableError(str(exc)) from exc
    except OSError as exc:
        raise RunUnreadableError(f"{_JOURNAL} cannot be read: {exc.strerror}") from exc


def _rows(run_dir: Path) -> list[IndexRow]:
    records = _journal(run_dir)
    trials = run_dir / TRIALS
    names = {
        record.rollout_id: "trajectory.json"
        for record in records.values()
        if (trials / record.rollout_id / "trajectory.json").is_file()
    }
    return index_rows(records, resumed_keys=set(), trajectory_filenames=names)


def run_items(run_dir: Path) -> list[dict[str, Any]]:
    """The run's work items, from its journal (so also while the run is going on).

    Raises:
        RunUnreadableError: The journal cannot be read.
    """
    return [row.to_json() for row in _rows(run_dir)]


def run_overview(run_dir: Path) -> dict[str, Any]:
    """The run page's header: manifest inputs, summary and pass@k, all from the journal;
    for a run that cannot be read, ``status`` ``broken`` and the ``problem``."""
    try:
        run = _load(run_dir)
    except RunUnreadableError as exc:
        return {"name": run_dir.name, "status": "broken", "problem": str(exc)}
    return {
        "name": run_dir.name,
        "status": run.status,
        "created_at": run.manifest.get("created_at"),
        "inputs": _object(run.manifest.get("inputs")),
        "summary": run.summary,
        "pass_threshold": run.pass_threshold,
        "pass_at_k": pass_at_k_points(run.rows, pass_threshold=run.pass_threshold),
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


def rollout_detail(
    run_dir: Path, rollout_id: str, *, trials: str = TRIALS
) -> dict[str, Any] | None:
    """A rollout's trajectory, diagnostics, artifact list and latest preview; its files are
    in ``run_dir/trials/<rollout_id>/``."""
    if not preview_id_allowed(rollout_id):
        return None
    trial = run_dir / trials / rollout_id
    preview = _read_json(run_dir / PREVIEWS_DIR / rollout_id / PREVIEW_FILENAME, run_dir)
    if not trial.is_dir() and preview is None:
        return None
    artifacts = trial / "artifacts"
    trajectory = _read_json(trial / "trajectory.json", run_dir)
    return {
        "rollout_id": rollout_id,
        "trajectory": trajectory,
        "diagnostics": _read_json(trial / "diagnostics.json", run_dir),
        "artifacts": _artifacts(artifacts) if _unlinked(artifacts, run_dir) else [],
        "preview": preview,
        "judges": _verdicts(trajectory, _read_json(trial / GROUP_JUDGE_FILE, run_dir)),
    }


def _verdicts(trajectory: Any, group: Any) -> list[dict[str, Any]]:
    """The judges' verdicts of a rollout, shown with its grade: its grader's judge (the
    sample's ``extra_fields["judge"]``) and the group judge's (beside the trajectory)."""
    found = []
    extra = trajectory.get("extra") if isinstance(trajectory, dict) else None
    osmosis = extra.get("osmosis") if isinstance(extra, dict) else None
    fields = osmosis.get("sample_extra_fields") if isinstance(osmosis, dict) else None
    verdict = fields.get("judge") if isinstance(fields, dict) else None
    for kind, value in (("judge", verdict), ("group judge", group)):
        if isinstance(value, dict):
            found.append({"kind": kind, **value})
    return found


def artifact_file(
    run_dir: Path, rollout_id: str, relative: str, *, trials: str = TRIALS
) -> Path | None:
    """The artifact file at ``relative`` inside the rollout's artifacts directory, or ``None``.

    Refuses absolute paths, ``..`` parts, links and anything that resolves outside.
    """
    if not preview_id_allowed(rollout_id) or not relative:
        return None
    parts = relative.split("/")
    if relative.startswith("/") or "\\" in relative or any(p in ("", ".", "..") for p in parts):
        return None
    base = run_dir / trials / rollout_id / "artifacts"
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

    Raises:
        RunUnreadableError: The journal cannot be read.
    """
    directory = run_dir / PREVIEWS_DIR
    if not directory.is_dir() or not _unlinked(directory, run_dir):
        return []
    finished = {record.rollout_id for record in _journal(run_dir).values()}
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
