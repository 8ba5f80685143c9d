"""What the viewer reads from training run directories. Blocking file I/O: call off the loop.

A training run directory is what ``osmosis train run`` writes (``.osmosis/train/<run>/``):
``events.jsonl`` (``start``, ``step``, ``eval``, ``checkpoint``, ``resume``, ``stopped``),
``metrics.jsonl`` (one line per applied step), ``rollouts.jsonl`` (one line per finished
rollout) and ``rollouts/<rollout_id>/`` (each rollout's trajectory and artifacts). A live run
may end any of them in half a line: it is skipped.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis_ai.train.run_files import RUN_FILES
from osmosis_ai.viewer.runs import (
    RunUnreadableError,
    ViewerRoot,
    read_json_lines,
    rollout_detail,
)

__all__ = ["ROLLOUTS", "step_rollouts", "train_overview", "train_rollout", "train_summaries"]

#: Where a training run keeps its rollouts' files (the rollout server's artifact root).
ROLLOUTS = RUN_FILES.rollouts
_EVENTS = RUN_FILES.events
_METRICS = RUN_FILES.metrics
_ROLLOUT_LINES = RUN_FILES.rollout_lines
# The runner's rollout ids: step-<step>-row-<row>-<k> (training), eval-<step>-row-<row>
# (eval-<step>-row-<row>-<k> with several samples per held-out row);
# matched as a prefix, so a suffix the runner may add (a resampled group) keeps its step.
_ROLLOUT_ID = re.compile(r"(step|eval)-(\d+)-row-(\d+)(?:-(\d+))?")


@dataclass(frozen=True)
class _TrainRun:
    """What the viewer shows of a training run, from one read of its journal and metrics."""

    status: str
    model: str | None
    steps_total: int | None
    metrics: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    kl_beta: float | None
    """The run's KL penalty (its KL chart is flat at 0 without one)."""


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _finite(line: dict[str, Any]) -> dict[str, Any]:
    """``line`` with non-finite numbers as ``None`` (JSON has no NaN)."""
    return {
        key: None if isinstance(value, float) and not math.isfinite(value) else value
        for key, value in line.items()
    }


def _by_step(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per step, the last written (a resumed run repeats steps), in step order."""
    kept = {step: line for line in lines if (step := _int(line.get("step"))) is not None}
    return [_finite(kept[step]) for step in sorted(kept)]


def _lock_held(run_dir: Path) -> bool | None:
    """Whether a process holds the run's lock (``run_lock``: ``<root>/.locks/<run>.lock``).

    Read from ``/proc/locks``: taking the lock, even for a moment, could refuse a run that
    starts then. ``None`` where that table does not exist (not Linux).
    """
    try:
        stat = (run_dir.parent / ".locks" / f"{run_dir.name}.lock").stat()
    except OSError:
        return False
    try:
        table = Path("/proc/locks").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    file_id = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    return any("FLOCK" in line and file_id in line.split() for line in table.splitlines())


def _status(events: list[dict[str, Any]], steps_done: int, total: int | None, run_dir: Path) -> str:
    held = _lock_held(run_dir)
    if held:
        return "running"
    starts = [i for i, event in enumerate(events) if event.get("event") == "start"]
    since = events[starts[-1] if starts else 0 :]
    if any(event.get("event") == "stopped" for event in since):
        return "stopped"
    # The runner's last act is the held-out evaluation after the last step.
    ended = any(e.get("event") == "eval" and _int(e.get("step")) == total for e in since)
    if total is not None and steps_done >= total and ended:
        return "finished"
    # Neither finished nor holding its lock: interrupted (Ctrl-C, killed); resumable.
    return "running" if held is None else "stopped"


def _load(run_dir: Path) -> _TrainRun:
    """Read a training run's journal and metrics.

    Raises:
        RunUnreadableError: A line before the last of either file is not a JSON object.
    """
    events = read_json_lines(run_dir / _EVENTS, run_dir)
    metrics = _by_step(read_json_lines(run_dir / _METRICS, run_dir))
    starts = [event for event in events if event.get("event") == "start"]
    total = _int(starts[-1].get("steps")) if starts else None
    model = starts[-1].get("model") if starts else None
    settings = starts[-1].get("settings") if starts else None
    # A run of before the sections (0.3) journaled its flat settings as "training".
    flat = starts[-1].get("training") if starts else None
    algorithm = settings.get("algorithm") if isinstance(settings, dict) else flat
    kl_beta = algorithm.get("kl_beta") if isinstance(algorithm, dict) else None
    evals = _by_step([event for event in events if event.get("event") == "eval"])
    steps_done = metrics[-1]["step"] if metrics else 0
    return _TrainRun(
        status=_status(events, steps_done, total, run_dir),
        model=model if isinstance(model, str) else None,
        steps_total=total,
        metrics=metrics,
        evals=[_eval_point(point) for point in evals],
        kl_beta=float(kl_beta) if isinstance(kl_beta, int | float) else None,
    )


def _eval_point(line: dict[str, Any]) -> dict[str, Any]:
    """A held-out evaluation: its step, pass rate and mean reward, and its pass@k points
    (``[{"k", "value"}]``, as the eval pages draw them; empty for one sample per row)."""
    at_k = line.get("pass_at_k")
    points = [
        {"k": int(k), "value": value}
        for k, value in (at_k.items() if isinstance(at_k, dict) else ())
        if k.isdigit() and isinstance(value, int | float)
    ]
    return {
        **{key: line.get(key) for key in ("step", "pass_rate", "mean_reward")},
        "pass_at_k": sorted(points, key=lambda point: point["k"]),
    }


def _header(run_dir: Path, run: _TrainRun) -> dict[str, Any]:
    """The fields the runs list and the run page share."""
    evals = run.evals
    return {
        "name": run_dir.name,
        "status": run.status,
        "model": run.model,
        "steps_done": run.metrics[-1]["step"] if run.metrics else 0,
        "steps_total": run.steps_total,
        "last_reward": run.metrics[-1].get("reward_mean") if run.metrics else None,
        "held_out_before": evals[0] if evals else None,
        "held_out_after": evals[-1] if len(evals) > 1 else None,
    }


def _broken(run_dir: Path, problem: Exception) -> dict[str, Any]:
    return {"name": run_dir.name, "status": "broken", "problem": str(problem)}


def train_summaries(root: ViewerRoot) -> list[dict[str, Any]]:
    """One line per training run for the runs page; a run that cannot be read is
    ``broken``, with its ``problem``, and does not hide the others."""
    out = []
    for run_dir in root.train_runs():
        try:
            out.append(_header(run_dir, _load(run_dir)))
        except RunUnreadableError as exc:
            out.append(_broken(run_dir, exc))
    return out


def train_overview(run_dir: Path) -> dict[str, Any]:
    """The training run page: its header, every step's metrics line and the held-out
    evaluations; for a run that cannot be read, ``status`` ``broken`` and the ``problem``."""
    try:
        run = _load(run_dir)
    except RunUnreadableError as exc:
        return _broken(run_dir, exc)
    return {
        **_header(run_dir, run),
        "metrics": run.metrics,
        "evals": run.evals,
        "kl_beta": run.kl_beta,
    }


def _rollout_lines(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The last line of each finished rollout (a resumed step runs its rollouts again)."""
    lines = read_json_lines(run_dir / _ROLLOUT_LINES, run_dir)
    return {line["rollout_id"]: line for line in lines if isinstance(line.get("rollout_id"), str)}


def _item(line: dict[str, Any]) -> dict[str, Any] | None:
    """A rollout's line as the eval items' shape, with its ``kind`` and ``step``."""
    match = _ROLLOUT_ID.match(line["rollout_id"])
    if match is None:
        return None
    kind, step, row, sample = match.groups()
    item = {
        "rollout_id": line["rollout_id"],
        "kind": "train" if kind == "step" else "held-out",
        "step": int(step),
        "row_index": int(row),
        "run_index": int(sample or 0),
        **{key: line.get(key) for key in ("status", "reward", "tokens")},
        **{key: line.get(key) for key in ("error_type", "error_message")},
    }
    return {key: value for key, value in item.items() if value is not None}


def step_rollouts(run_dir: Path, step: int) -> list[dict[str, Any]]:
    """The finished rollouts of ``step``: its training rollouts, then the held-out ones
    evaluated after it (if any), each by row and sample.

    Raises:
        RunUnreadableError: ``rollouts.jsonl`` cannot be read.
    """
    items = [item for line in _rollout_lines(run_dir).values() if (item := _item(line))]
    chosen = [item for item in items if item["step"] == step]
    return sorted(chosen, key=lambda i: (i["kind"] != "train", i["row_index"], i["run_index"]))


def train_rollout(run_dir: Path, rollout_id: str) -> dict[str, Any] | None:
    """A rollout's trajectory, diagnostics and artifacts (as for eval runs), with its
    ``item`` (status, reward...) once it finished.

    Raises:
        RunUnreadableError: ``rollouts.jsonl`` cannot be read.
    """
    detail = rollout_detail(run_dir, rollout_id, trials=ROLLOUTS)
    if detail is None:
        return None
    line = _rollout_lines(run_dir).get(rollout_id)
    return {**detail, "item": _item(line) if line is not None else None}
