"""The execution-backend contract: what a rollout server asks of whatever runs workflows."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout.ids import ensure_single_path_segment
from osmosis_ai.rollout.sample import JSONObject, RolloutSample
from osmosis_ai.rollout.status import CancelDisposition, RolloutErrorCategory, RolloutStatus

if TYPE_CHECKING:  # the wire types import this module
    from osmosis_ai.rollout.types import RolloutInitRequest

__all__ = [
    "CancelDisposition",
    "backend_failure",
    "ExecutionBackend",
    "ExecutionOutcome",
    "ExecutionRequest",
    "ExecutionResult",
]


def _check_timeout(name: str, value: float | None) -> float | None:
    # Zero or negative deadlines are allowed (already expired); NaN/inf would never fire.
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number of seconds or None, got {value!r}")
    return float(value)


@dataclass(slots=True)
class ExecutionRequest:
    """One rollout to execute: the dataset row's inputs and the deadlines."""

    id: str
    """Rollout id; a single safe path segment."""

    prompt: list[JSONObject]
    """Initial messages given to the workflow."""

    label: str | None = None
    """Ground truth, given only to the grader."""

    metadata: dict[str, Any] | None = None
    """Per-row metadata, given to both workflow and grader."""

    agent_timeout_sec: float | None = None
    """Workflow deadline measured from submission (queue time counts); ``None`` = none."""

    grader_timeout_sec: float | None = None
    """Grader deadline, measured from the start of grading; ``None`` = none."""

    grade: bool = True
    """Whether to run the grader after a successful workflow."""

    def __post_init__(self) -> None:
        ensure_single_path_segment(self.id, label="rollout_id")
        self.agent_timeout_sec = _check_timeout("agent_timeout_sec", self.agent_timeout_sec)
        self.grader_timeout_sec = _check_timeout("grader_timeout_sec", self.grader_timeout_sec)

    @classmethod
    def from_init(cls, init: RolloutInitRequest) -> ExecutionRequest:
        """The rollout a wire ``POST /rollout`` asks for (endpoint and key stay with the
        rollout context)."""
        return cls(
            id=init.rollout_id,
            prompt=init.initial_messages,
            label=init.label,
            metadata=init.metadata,
            agent_timeout_sec=init.agent_timeout_sec,
            grader_timeout_sec=init.grader_timeout_sec,
            grade=init.grade,
        )


@dataclass(slots=True)
class ExecutionResult:
    """The result of one phase (workflow or grader) of a rollout."""

    status: RolloutStatus
    """``success`` or ``failure`` (``cancelled`` when the phase was cancelled)."""

    sample: RolloutSample | None = None
    """The sample, when one was produced (failed gradings keep the workflow's sample)."""

    err_message: str | None = None
    """What went wrong and how to fix it; never contains a secret."""

    err_category: RolloutErrorCategory | None = None
    """Why it failed, for the wire."""

    extra_fields: dict[str, Any] | None = field(default=None)
    """Backend diagnostics; never on the wire, written to ``diagnostics.json``."""

    @property
    def ok(self) -> bool:
        """Whether the phase succeeded."""
        return self.status is RolloutStatus.SUCCESS


def backend_failure(
    backend: str,
    phase: str,
    message: str,
    category: RolloutErrorCategory,
    details: dict[str, Any] | None = None,
) -> ExecutionResult:
    """A failed phase reported by a backend itself (not raised by user code), with its
    diagnostics: ``{"backend", "phase", **details}``."""
    return ExecutionResult(
        status=RolloutStatus.FAILURE,
        err_message=message,
        err_category=category,
        extra_fields={"backend": backend, **(details or {}), "phase": phase},
    )


@dataclass(slots=True)
class ExecutionOutcome:
    """Both phases of one rollout."""

    workflow: ExecutionResult
    """Result of the workflow phase."""

    grader: ExecutionResult | None = None
    """Result of the grader phase; ``None`` when grading did not run."""

    @property
    def result(self) -> ExecutionResult:
        """The rollout's final result.

        A failed workflow is the result (borrowing the grader's sample if it has none);
        otherwise the grader's result when grading ran, else the workflow's.
        """
        if not self.workflow.ok:
            if self.workflow.sample is None and self.grader is not None:
                return replace(self.workflow, sample=self.grader.sample)
            return self.workflow
        return self.grader if self.grader is not None else self.workflow

    @property
    def result_to_save(self) -> ExecutionResult:
        """The result whose sample is persisted: the grader's when it has a sample."""
        if self.grader is not None and self.grader.sample is not None:
            return self.grader
        return self.workflow


class ExecutionBackend(ABC):
    """Runs rollouts for a rollout server.

    A backend executes one ``ExecutionRequest`` per call to ``execute()``, concurrently with
    others, and reports both phases in an ``ExecutionOutcome``. The server calls it inside an
    active ``RolloutContext`` (model endpoint, key, id and a status observer), creates the
    execution task before acknowledging the rollout, and owns leases, retention,
    trajectory files and draining; the backend owns running user code and capacity.

    Implementations must never raise out of ``execute()`` for a failure of user code: such
    failures are results with a category. ``execute()`` may be cancelled (lease expiry,
    cancel requests, shutdown); it must then release everything it holds.

    Subclass contract:
        * ``execute()`` — required.
        * ``has_capacity()`` — ``False`` makes the server answer 429 with ``Retry-After``.
        * ``health()`` — merged into the server's ``/health`` payload; include capacity.
        * ``cancel_rollouts()`` — cancel work the backend tracks itself (queued work in a
          remote pool, sandboxes...). The server cancels its own tasks for ids the backend
          answers ``not_found`` for.
        * ``start()`` — acquire resources (a cluster, workers) when the server starts,
          before it admits rollouts.
        * ``shutdown()`` — release resources after admission stopped and in-flight rollouts
          were drained or cancelled.
    """

    #: Whether the backend reports ``running``/``grading`` itself through the rollout
    #: context's ``set_status``. If not, the server reports ``running`` when it starts
    #: the execution.
    reports_progress: bool = False

    @abstractmethod
    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        """Run the workflow and, when asked, the grader for one rollout."""

    def has_capacity(self) -> bool:
        """Whether a new rollout can start now without waiting for a slot."""
        return True

    def health(self) -> dict[str, Any]:
        """Health and capacity facts for ``GET /health``."""
        return {"status": "ok"}

    def cancel_rollouts(
        self,
        ids: list[str] | None = None,
        prefix: str | None = None,
        all: bool = False,
    ) -> dict[str, CancelDisposition]:
        """Cancel rollouts the backend tracks; returns a disposition per id."""
        return {}

    async def start(self) -> None:
        """Acquire resources before the first rollout; the server calls it at startup."""
        return None

    async def shutdown(self) -> None:
        """Release resources once the server stopped admitting and drained."""
        return None
