"""What a training run gives its caller: the hooks that hear it as it goes, its held-out
evaluations, and its outcome or the stop that ended it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from osmosis_ai.errors import OsmosisError

__all__ = ["EvalPoint", "QuietHooks", "TrainHooks", "TrainOutcome", "TrainingStopped"]


class TrainingStopped(OsmosisError):
    """The run stopped before its last step; the message names the step and how to resume.

    ``outcome`` is what the run did until then (its held-out evaluations), when it got as
    far as starting the loop.
    """

    def __init__(self, message: str, outcome: TrainOutcome | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclass(frozen=True)
class EvalPoint:
    """A held-out evaluation after ``step`` applied steps."""

    step: int
    pass_rate: float
    mean_reward: float
    pass_at_k: dict[int, float] = field(default_factory=dict)
    """pass@1..k when ``[eval] samples`` is k > 1 (empty for one sample per row)."""

    def to_json(self) -> dict[str, Any]:
        """The journal's ``eval`` line."""
        line: dict[str, Any] = {
            "event": "eval",
            "step": self.step,
            "pass_rate": self.pass_rate,
            "mean_reward": self.mean_reward,
        }
        if self.pass_at_k:
            line["pass_at_k"] = {str(k): value for k, value in self.pass_at_k.items()}
        return line

    @classmethod
    def from_json(cls, line: Mapping[str, Any]) -> EvalPoint:
        """The point of a journal's ``eval`` line."""
        return cls(
            int(line["step"]),
            float(line["pass_rate"]),
            float(line["mean_reward"]),
            {int(k): float(v) for k, v in (line.get("pass_at_k") or {}).items()},
        )

    def scalars(self) -> dict[str, float]:
        """What the trackers get: ``eval/pass_rate``, ``eval/mean_reward``, ``eval/pass@k``."""
        values = {"eval/pass_rate": self.pass_rate, "eval/mean_reward": self.mean_reward}
        values.update({f"eval/pass@{k}": value for k, value in self.pass_at_k.items()})
        return values


@dataclass
class TrainOutcome:
    """How the run ended."""

    run_dir: Path
    steps_done: int = 0
    evals: list[EvalPoint] = field(default_factory=list)
    verdict: str | None = None
    """Said at the end when few or none of the run's steps updated the weights
    (`training_verdict`)."""


class TrainHooks(Protocol):
    """What the CLI hears as the run goes."""

    def message(self, text: str) -> None:
        """A progress message."""

    def started(self, first_step: int, last_step: int) -> None:
        """The loop runs steps ``first_step``..``last_step`` (a resumed run starts later)."""

    def step_done(self, metrics: Mapping[str, Any]) -> None:
        """One applied step's metrics line."""

    def eval_done(self, point: EvalPoint) -> None:
        """A held-out evaluation finished."""


class QuietHooks:
    """Hooks that say nothing (library use)."""

    def message(self, text: str) -> None:
        pass

    def started(self, first_step: int, last_step: int) -> None:
        pass

    def step_done(self, metrics: Mapping[str, Any]) -> None:
        pass

    def eval_done(self, point: EvalPoint) -> None:
        pass
