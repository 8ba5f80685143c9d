"""What a run says about itself at its end: whether its steps trained, and whether it was
already finished (so that running it again loads nothing).

Pure functions of the run's own files' lines (``metrics.jsonl``, ``events.jsonl``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from osmosis_ai.train.bookkeeping.journal import journaled_evals, last_checkpoint
from osmosis_ai.train.config import TrainConfig
from osmosis_ai.train.loop.outcome import EvalPoint
from osmosis_ai.train.loop.report import step_seconds
from osmosis_ai.train.loop.step import EQUAL_REWARDS

__all__ = ["FEW_UPDATES", "finished_run", "training_verdict"]

#: A run in which fewer than this share of steps updated the weights says so at its end.
FEW_UPDATES = 0.5

Line = dict[str, Any]


def training_verdict(metrics: list[Line], config: TrainConfig) -> str | None:
    """One line when fewer than `FEW_UPDATES` of the run's steps (``metrics.jsonl``'s lines)
    updated the weights: how many did, why the others did not, and what to try; else
    ``None``."""
    if not metrics:
        return None
    idle = Counter(str(line["no_update"]) for line in metrics if line.get("no_update"))
    updated = len(metrics) - sum(idle.values())
    if updated >= FEW_UPDATES * len(metrics):
        return None
    head = "nothing was trained" if not updated else "little was trained"
    why = "; ".join(f"{reason} in {count}" for reason, count in idle.most_common())
    line = f"{head}: {updated} of {len(metrics)} steps updated the weights ({why})"
    if EQUAL_REWARDS in idle:
        line += (
            ". The rollouts of each row scored alike: try a higher temperature (now "
            f"{config.sampling.temperature:g}), more rollouts per row (group_size, now "
            f"{config.training.group_size}), [algorithm] resample_zero_gradient = 2 (or recipe "
            '= "dapo"), or a grader with partial credit'
        )
    return line


def finished_run(
    events: list[Line], metrics: list[Line], config: TrainConfig
) -> tuple[str, list[EvalPoint]] | None:
    """When the run's journal says it is done (its last step, or ``max_minutes``, checkpointed
    and evaluated): what to say instead of training, and its held-out results."""
    step = last_checkpoint(events)
    evals = journaled_evals(events, step)
    if not evals or evals[-1].step != step:
        return None  # the last evaluation did not finish: the run goes on to run it
    # Lines of steps after the checkpoint (a killed run's) run again: they do not count.
    applied = [line for line in metrics if int(line["step"]) <= step]
    training = config.training
    if step >= training.steps:
        done = f"it trained all {training.steps} steps; to train further raise training.steps"
    elif training.max_minutes and sum(map(step_seconds, applied)) >= training.max_minutes * 60:
        done = (
            f"its {step} steps took max_minutes ({training.max_minutes:g}); to train further "
            "raise training.max_minutes"
        )
    else:
        return None
    return f"nothing to do: {done} (or --fresh starts over)", evals
