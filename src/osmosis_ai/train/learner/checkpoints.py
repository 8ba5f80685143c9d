"""Checkpoints of a run: ``checkpoints/step-NNNN/`` saved, journaled and pruned to the newest
``[checkpoints] keep``, and ``checkpoints/latest``, a link to the newest."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from osmosis_ai.train.bookkeeping.journal import append
from osmosis_ai.train.learner.core import Learner, checkpoint_steps
from osmosis_ai.train.run_files import RUN_FILES

__all__ = ["LATEST_CHECKPOINT", "checkpoint", "checkpoint_dir"]

#: ``checkpoints/<this>`` links to the newest checkpoint.
LATEST_CHECKPOINT = "latest"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """``checkpoints/step-NNNN/`` of ``step``."""
    return run_dir / RUN_FILES.checkpoints / f"step-{step:04d}"


def checkpoint(learner: Learner, run_dir: Path, step: int, keep: int) -> None:
    """Save the checkpoint, journal it, then drop all but the newest ``keep`` (blocking)."""
    directory = checkpoint_dir(run_dir, step)
    directory.parent.mkdir(parents=True, exist_ok=True)
    learner.save(directory, step)
    append(run_dir / RUN_FILES.events, {"event": "checkpoint", "step": step})
    # ``checkpoints/latest`` names the newest one for `osmosis eval run --model torch:...`.
    latest = directory.parent / LATEST_CHECKPOINT
    temp = latest.with_name(f".{LATEST_CHECKPOINT}.tmp")
    temp.unlink(missing_ok=True)
    temp.symlink_to(directory.name, target_is_directory=True)
    os.replace(temp, latest)
    # Directories of later steps are leftovers of steps a resume ran again: never kept.
    kept = [p for n, p in checkpoint_steps(directory.parent).items() if n <= step][-keep:]
    for old in directory.parent.iterdir():
        if old not in (*kept, latest):
            shutil.rmtree(old, ignore_errors=True)
