"""Index rows of an eval run and the summary metrics computed from them (pure functions)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from osmosis_ai.errors import ConfigError
from osmosis_ai.eval.journal import JournalRecord, JournalStatus, WorkItem
from osmosis_ai.rollout.sample import JSONObject

__all__ = [
    "IndexRow",
    "failure_line",
    "failure_lines",
    "index_rows",
    "pass_at_k",
    "pass_at_k_points",
    "passes",
    "summarize",
]


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One row of ``index.jsonl``: the selected attempt of one work item.

    Attributes:
        row_index: Position of the row within the selected rows (0-based).
        run_index: Which of the ``n`` runs of that row (0-based).
        rollout_id: Id of the rollout whose outcome this row reports.
        status: ``success``, ``failed`` or ``skipped``.
        reward: Reward, when the rollout was graded.
        tokens: Tokens used, when counted.
        duration_ms: Wall time in milliseconds, when measured.
        trajectory_filename: ``trajectory.json`` when the rollout's trajectory exists and
            carries its identity, else ``None``.
        error_type: Failure category, when failed.
        error_message: What went wrong and how to fix it, when recorded.
        resumed: The outcome was carried forward from an earlier invocation of the run.
        source_row_index: Offset of the row in the dataset file (local only, see `to_json`).
    """

    row_index: int
    run_index: int
    rollout_id: str
    status: JournalStatus
    reward: float | None = None
    tokens: int | None = None
    duration_ms: float | None = None
    trajectory_filename: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    resumed: bool = False
    source_row_index: int | None = None

    @property
    def key(self) -> WorkItem:
        """The work item of this row: ``(row_index, run_index)``."""
        return (self.row_index, self.run_index)

    def to_json(self) -> JSONObject:
        """The platform index-row object: ``None`` fields omitted, ``resumed`` only when true.

        ``source_row_index`` is a local detail of the dataset file and is not part of the
        platform schema, so it is never emitted.

        Returns:
            A dict in the platform key order (``row_index``, ``run_index``, ``rollout_id``,
            ``trajectory_filename``, ``status``, ``reward``, ``tokens``, ``duration_ms``,
            ``error_type``, ``error_message``, ``resumed``).
        """
        ordered: JSONObject = {
            "row_index": self.row_index,
            "run_index": self.run_index,
            "rollout_id": self.rollout_id,
            "trajectory_filename": self.trajectory_filename,
            "status": self.status,
            "reward": self.reward,
            "tokens": self.tokens,
            "duration_ms": self.duration_ms,
            "error_type": self.error_type,
            "error_message": self.error_message,
            "resumed": True if self.resumed else None,
        }
        return {name: value for name, value in ordered.items() if value is not None}


def index_rows(
    records: Mapping[WorkItem, JournalRecord],
    *,
    resumed_keys: Set[WorkItem],
    trajectory_filenames: Mapping[str, str],
) -> list[IndexRow]:
    """Project the replayed journal into index rows sorted by ``(row_index, run_index)``.

    Args:
        records: Latest record per work item (see `Journal.replay`).
        resumed_keys: Work items whose record was committed by an earlier invocation.
        trajectory_filenames: Trajectory file name per **rollout id**, for the rollouts
            whose trajectory exists and carries their identity. Keying by rollout id means a
            retried item whose new attempt has no trajectory gets none, never a stale one.

    Returns:
        One row per record, sorted by work item.
    """
    return [
        IndexRow(
            row_index=record.row_index,
            run_index=record.run_index,
            rollout_id=record.rollout_id,
            status=record.status,
            reward=record.reward,
            tokens=record.tokens,
            duration_ms=record.duration_ms,
            trajectory_filename=trajectory_filenames.get(record.rollout_id),
            error_type=record.error_type,
            error_message=record.error_message,
            resumed=record.key in resumed_keys,
            source_row_index=record.source_row_index,
        )
        for record in sorted(records.values(), key=lambda r: r.key)
    ]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate from ``n`` attempts of which ``c`` passed.

    The probability that at least one of ``k`` attempts drawn without replacement passes:
    ``1 - prod_{i<k} (n-c-i)/(n-i)``, which is 1.0 when fewer than ``k`` attempts failed.

    Args:
        n: Attempts made.
        c: Attempts that passed.
        k: Attempts drawn.

    Returns:
        The estimate, in ``[0, 1]``.

    Raises:
        ConfigError: Unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"pass_at_k {name}={value!r} must be an integer")
    if not 0 <= c <= n:
        raise ConfigError(f"pass_at_k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ConfigError(f"pass_at_k needs 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    miss_all = 1.0
    for i in range(k):
        miss_all *= (n - c - i) / (n - i)
    return 1.0 - miss_all


def passes(status: str, reward: float | None, pass_threshold: float) -> bool:
    """Whether an outcome counts as a pass: graded, not skipped, reward >= ``pass_threshold``.

    The one definition behind the final table, pass@k and the CLI's live counter.
    """
    return status != "skipped" and reward is not None and reward >= pass_threshold


def failure_line(failures: Iterable[tuple[str | None, str | None]], total: int) -> str:
    """One line for the rollouts that failed among ``total``: how many, by category (most
    first), and the first one's message.

    Args:
        failures: ``(category, message)`` of each failed rollout, in run order.
        total: How many rollouts there were.

    Returns:
        E.g. ``24 of 24 rollouts failed (agent_error 24); first: workflow raised ...``.
    """
    failed = list(failures)
    counts = Counter(category or "unknown" for category, _ in failed)
    by_category = ", ".join(f"{category} {count}" for category, count in counts.most_common())
    line = f"{len(failed)} of {total} rollouts failed ({by_category})"
    first = next((message for _, message in failed if message and message.strip()), None)
    return f"{line}; first: {first.strip().splitlines()[0]}" if first else line


def failure_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per distinct failure (category and message), in run order: one row's says
    where it is, repeated ones how many rows share it and where the first is."""
    same: dict[tuple[Any, Any], list[Mapping[str, Any]]] = {}
    for row in rows:
        same.setdefault((row["error_type"], row["error_message"]), []).append(row)
    lines = []
    for (category, message), group in same.items():
        first = group[0]
        where = f" -> {first['rollout_dir']}" if first["rollout_dir"] else ""
        why = f": {message}" if message else ""
        who = f"row {first['row_index']} run {first['run_index']}"
        if len(group) > 1:
            who = f"{len(group)} rollouts (first {who})"
        lines.append(f"  {who}: error_type={category}{why}{where}")
    return lines


def _passed(row: IndexRow, pass_threshold: float) -> bool:
    return passes(row.status, row.reward, pass_threshold)


def pass_at_k_points(rows: Sequence[IndexRow], *, pass_threshold: float) -> list[JSONObject]:
    """pass@k for k = 1, 2, 4, ... up to the number of runs.

    Attempts of a row are its index rows that are not ``skipped``; an attempt passes when
    its reward is at least ``pass_threshold``. Each point averages `pass_at_k` over the rows
    with at least ``k`` attempts; a ``k`` that no row reaches gives no point.

    Args:
        rows: The index rows of the run.
        pass_threshold: Minimum reward that counts as a pass.

    Returns:
        ``[{"k": k, "value": v}, ...]`` in increasing ``k``; empty for no rows.
    """
    if not rows:
        return []
    n_runs = max(row.run_index for row in rows) + 1
    attempts: dict[int, list[bool]] = {}
    for row in rows:
        if row.status != "skipped":
            attempts.setdefault(row.row_index, []).append(_passed(row, pass_threshold))
    points: list[JSONObject] = []
    k = 1
    while k <= n_runs:
        values = [
            pass_at_k(len(outcomes), sum(outcomes), k)
            for outcomes in attempts.values()
            if len(outcomes) >= k
        ]
        if values:
            points.append({"k": k, "value": sum(values) / len(values)})
        k *= 2
    return points


def summarize(rows: Sequence[IndexRow], *, pass_threshold: float) -> JSONObject:
    """The ``summary`` object of ``metrics.json``.

    ``passed`` counts rows that are not ``skipped`` and whose reward reaches
    ``pass_threshold``; ``pass_rate`` divides it by ``completed_samples`` (rows not skipped),
    so failed rows without a reward count as non-passes. ``reward_stats`` (population
    ``std``) appears only when some row has a reward; ``n_runs`` only when at least 2; and
    ``pass_at_k`` only when ``n_runs >= 2`` and it has at least 2 points.

    Args:
        rows: The index rows of the run.
        pass_threshold: Minimum reward that counts as a pass.

    Returns:
        A JSON object with ``total_samples``, ``completed_samples``, ``graded``,
        ``passed``, ``failed``, ``skipped``, ``pass_rate``, ``pass_threshold``,
        ``tokens_used`` and, when they apply, ``reward_stats``, ``n_runs``, ``pass_at_k``.

    Raises:
        ConfigError: ``pass_threshold`` is not a finite number.
    """
    if not isinstance(pass_threshold, int | float) or not math.isfinite(pass_threshold):
        raise ConfigError(f"pass_threshold {pass_threshold!r} must be a finite number")
    completed = [row for row in rows if row.status != "skipped"]
    rewards = [row.reward for row in rows if row.reward is not None]
    passed = sum(1 for row in completed if _passed(row, pass_threshold))
    summary: JSONObject = {
        "total_samples": len(rows),
        "completed_samples": len(completed),
        "graded": len(rewards),
        "passed": passed,
        "failed": sum(1 for row in rows if row.status == "failed"),
        "skipped": len(rows) - len(completed),
        "pass_rate": passed / len(completed) if completed else 0.0,
        "pass_threshold": float(pass_threshold),
        "tokens_used": sum(row.tokens for row in rows if row.tokens is not None),
    }
    if rewards:
        summary["reward_stats"] = {
            "mean": statistics.fmean(rewards),
            "median": float(statistics.median(rewards)),
            "std": statistics.pstdev(rewards),
            "min": min(rewards),
            "max": max(rewards),
        }
    n_runs = max((row.run_index for row in rows), default=-1) + 1
    if n_runs >= 2:
        summary["n_runs"] = n_runs
        points = pass_at_k_points(rows, pass_threshold=pass_threshold)
        if len(points) >= 2:
            summary["pass_at_k"] = points
    return summary
