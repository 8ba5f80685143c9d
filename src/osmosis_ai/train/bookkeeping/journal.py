"""The run directory's journal (``events.jsonl``) and ``metrics.jsonl``: whole JSON lines
flushed to disk, read back on resume, and rewound to the checkpoint a resume starts after."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from osmosis_ai.train.loop.outcome import EvalPoint
from osmosis_ai.train.run_files import RUN_FILES

__all__ = ["append", "journaled_evals", "last_checkpoint", "read_lines", "rewind"]


def append(path: Path, data: Mapping[str, Any]) -> None:
    """One JSON line, flushed to disk before returning (a crash keeps whole lines)."""
    with path.open("a", encoding="utf-8") as file:
        file.write(json.dumps(data, sort_keys=True) + "\n")
        file.flush()
        os.fsync(file.fileno())


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (none when it does not exist)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    # A line cut by a crash mid-write is the only one that may not parse: the last.
    parsed = []
    for index, line in enumerate(lines):
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            if index != len(lines) - 1:
                raise
    return parsed


def last_checkpoint(events: list[dict[str, Any]]) -> int:
    """The step of the journal's last ``checkpoint`` line (0: none): a resume starts after it."""
    steps = [int(e["step"]) for e in events if e.get("event") == "checkpoint"]
    return max(steps, default=0)


def rewind(run_dir: Path, step: int) -> None:
    """Drop metrics, step and eval lines after checkpoint ``step``: those steps run again.

    So each step (and each evaluation) appears once, however often the run was killed.
    """
    _rewrite(run_dir / RUN_FILES.metrics, lambda line: int(line["step"]) <= step)
    _rewrite(
        run_dir / RUN_FILES.events,
        lambda line: line.get("event") not in ("step", "eval") or int(line["step"]) <= step,
    )


def _rewrite(path: Path, keep: Callable[[dict[str, Any]], bool]) -> None:
    """Keep the lines of ``path`` that ``keep`` accepts (a whole new file renamed into place)."""
    if not path.exists():
        return
    kept = [line for line in read_lines(path) if keep(line)]
    temp = path.with_name(path.name + ".tmp")
    temp.write_text("".join(json.dumps(x, sort_keys=True) + "\n" for x in kept), encoding="utf-8")
    os.replace(temp, path)


def journaled_evals(events: list[dict[str, Any]], start: int) -> list[EvalPoint]:
    """Held-out results already journaled up to the checkpoint a resume starts from."""
    evals = [e for e in events if e.get("event") == "eval"]
    return [EvalPoint.from_json(e) for e in evals if int(e["step"]) <= start]
