"""``LocalBackend``: runs workflows and graders in this process, on this event loop."""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from osmosis_ai.errors import ConfigError, DeadlineExceeded, GradingError, RolloutFailure
from osmosis_ai.rollout._artifacts import create_artifacts_dir
from osmosis_ai.rollout._failures import categorize, describe
from osmosis_ai.rollout._imports import resolve_object
from osmosis_ai.rollout._storage import default_artifact_root
from osmosis_ai.rollout.backend._limiter import ConcurrencyLimiter
from osmosis_ai.rollout.backend.base import ExecutionBackend, ExecutionOutcome, ExecutionRequest
from osmosis_ai.rollout.backend.base import ExecutionResult as Result
from osmosis_ai.rollout.config import AgentWorkflowConfig, BaseConfig, GraderConfig
from osmosis_ai.rollout.context import (
    AgentWorkflowContext,
    GraderContext,
    RolloutContext,
    get_rollout_context,
)
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.rollout.workflow import AgentWorkflow, normalize_output

__all__ = ["LocalBackend"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
C = TypeVar("C", bound=BaseConfig)

# Queue waits shorter than this are not worth mentioning in a deadline message.
_QUEUE_NOTE_MIN_SEC = 0.1


class _PhaseDeadline(DeadlineExceeded):
    """A phase ran past its deadline (raised by the backend, not by user code)."""

    def __init__(self, phase: str, limit: float | None, queued_sec: float) -> None:
        message = f"{phase} exceeded its {limit:g}s deadline" if limit is not None else phase
        if queued_sec >= _QUEUE_NOTE_MIN_SEC:
            message += f" ({queued_sec:.1f}s of it spent queued)"
        super().__init__(message)


def _resolve_class(ref: object, base: type[Any], label: str) -> Any:
    obj = resolve_object(ref, label=label)
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise ConfigError(f"{label} must be a subclass of {base.__name__}, got {obj!r}")
    return obj


def _resolve_config(ref: object, base: type[C], label: str) -> C | None:
    if ref is None:
        return None
    obj = resolve_object(ref, label=label)
    if not isinstance(obj, base):
        raise ConfigError(f"{label} must be a {base.__name__} instance, got {type(obj).__name__}")
    try:
        copy.deepcopy(obj)
    except Exception as exc:
        # Each rollout gets a private copy; find out now rather than on the first rollout.
        raise ConfigError(
            f"{label} cannot be deep-copied ({type(exc).__name__}); every rollout receives a "
            "private copy, so keep non-copyable resources out of the config"
        ) from exc
    return obj


class LocalBackend(ExecutionBackend):
    """Runs each rollout's workflow and grader in-process, concurrently, on the event loop.

    Each rollout gets a fresh workflow (and grader) instance with a private deep copy of its
    config, an artifacts directory under the artifact root, and deadlines: the agent
    deadline counts from submission (time spent waiting for a slot is included, because
    the controller's clock started then), the grader deadline from the start of grading.
    A deadline is reported as ``timeout`` even when user code blocked the event loop or
    swallowed the cancellation. Every failure of user code becomes a result with a
    category; nothing escapes ``execute()`` except cancellation.

    Concurrency: ``workflow_config.concurrency.max_concurrent`` caps simultaneous
    workflows and ``grader_config.concurrency.max_concurrent`` simultaneous gradings. The
    default, with or without a config, is no cap. With a cap, ``has_capacity()`` turns
    false when all slots are busy, so a rollout server answers 429 rather than queueing.

    Calling ``run_workflow()`` or ``execute()`` directly from a custom harness does not save
    trajectories; ``create_rollout_server`` does that.

    Args:
        workflow: An ``AgentWorkflow`` subclass or its ``"module:Class"`` import path.
        workflow_config: A config instance, its ``"module:name"`` path, or ``None``.
        grader: A ``Grader`` subclass, its import path, or ``None`` (no grading).
        grader_config: A grader config instance, its import path, or ``None``.
        artifact_root: Root of per-rollout directories; defaults to
            ``$_OSMOSIS_ROLLOUT_ARTIFACT_ROOT`` or ``~/.osmosis``, read at construction.

    Raises:
        ConfigError: A reference does not resolve to the right kind of object, or a config
            cannot be deep-copied.
    """

    reports_progress = True

    def __init__(
        self,
        *,
        workflow: type[AgentWorkflow[Any]] | str,
        workflow_config: AgentWorkflowConfig | str | None = None,
        grader: type[Grader] | str | None = None,
        grader_config: GraderConfig | str | None = None,
        artifact_root: Path | str | None = None,
    ) -> None:
        self.workflow_cls: type[AgentWorkflow[Any]] = _resolve_class(
            workflow, AgentWorkflow, "workflow"
        )
        self.workflow_config = _resolve_config(
            workflow_config, AgentWorkflowConfig, "workflow_config"
        )
        self.grader_cls: type[Grader] | None = (
            None if grader is None else _resolve_class(grader, Grader, "grader")
        )
        self.grader_config = _resolve_config(grader_config, GraderConfig, "grader_config")
        self.artifact_root = (
            Path(artifact_root).expanduser() if artifact_root else default_artifact_root()
        )
        cap = self.workflow_config.concurrency.max_concurrent if self.workflow_config else None
        grader_cap = self.grader_config.concurrency.max_concurrent if self.grader_config else None
        self._workflows = ConcurrencyLimiter(cap)
        self._graders = ConcurrencyLimiter(grader_cap)

    def arguments(self) -> dict[str, Any]:
        """This backend's resolved constructor arguments, for building another backend
        (`RayBackend`, `ProcessBackend`) that runs the same workflow, grader and configs."""
        return {
            "workflow": self.workflow_cls,
            "workflow_config": self.workflow_config,
            "grader": self.grader_cls,
            "grader_config": self.grader_config,
            "artifact_root": self.artifact_root,
        }

    # -- ExecutionBackend ----------------------------------------------------------------

    def has_capacity(self) -> bool:
        """False when every workflow slot is taken (only possible with a cap)."""
        return self._workflows.has_free_slot()

    def health(self) -> dict[str, Any]:
        """``{"status": "ok", "concurrency": {"max_concurrent", "queued", "running"}}``."""
        return {"status": "ok", "concurrency": self._workflows.snapshot()}

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        """Run the workflow, then the grader when one exists and ``request.grade`` is true."""
        workflow, artifacts_dir = await self._run_workflow(request, time.monotonic())
        if not workflow.ok or not request.grade or self.grader_cls is None:
            return ExecutionOutcome(workflow=workflow)
        grader = await self._run_grader(request, workflow.sample, artifacts_dir)
        return ExecutionOutcome(workflow=workflow, grader=grader)

    # -- phases, also usable one at a time from a custom harness ---------------------------

    async def run_workflow(
        self, request: ExecutionRequest, *, submitted_at: float | None = None
    ) -> Result:
        """Run only the workflow phase of ``request`` and return its result.

        Args:
            request: The rollout to run.
            submitted_at: ``time.monotonic()`` when the rollout was submitted; queue time
                since then counts against the agent deadline. Defaults to now.
        """
        started = time.monotonic() if submitted_at is None else submitted_at
        result, _ = await self._run_workflow(request, started)
        return result

    async def run_grader(
        self, request: ExecutionRequest, result: Result | RolloutSample | None
    ) -> Result:
        """Run only the grader phase and return its result.

        As in the reference SDK, a harness passes on what the workflow phase returned:
        ``await backend.run_grader(request, await backend.run_workflow(request))``. A
        failed workflow result comes back unchanged and the grader does not run: there is
        nothing to grade, and the workflow's category and message stay the rollout's.

        Args:
            request: The rollout being graded (its label and metadata reach the grader).
            result: The result of ``run_workflow(request)``, or the sample itself
                (``None``: no sample, which fails saying so).

        Returns:
            The grading's result. It carries the sample whatever happens, so a failed
            grading still shows what was graded.

        Raises:
            ConfigError: The backend has no grader.
        """
        if self.grader_cls is None:
            raise ConfigError("this LocalBackend has no grader; pass grader=... to grade")
        if isinstance(result, Result) and not result.ok:
            return result
        sample = result.sample if isinstance(result, Result) else result
        artifacts_dir = await self._artifacts_dir(request.id)
        return await self._run_grader(request, sample, artifacts_dir)

    async def _artifacts_dir(self, rollout_id: str) -> Path | None:
        # The in-container runner overrides this: its artifacts dir is fixed by the harness.
        return await create_artifacts_dir(self.artifact_root, rollout_id)

    async def _run_workflow(
        self, request: ExecutionRequest, submitted_at: float
    ) -> tuple[Result, Path | None]:
        await self._workflows.acquire()
        try:
            queued_sec = time.monotonic() - submitted_at
            with self._rollout_context(request) as rollout_ctx:
                rollout_ctx.set_status(RolloutStatus.RUNNING)
                artifacts_dir = await self._artifacts_dir(request.id)
                config = copy.deepcopy(self.workflow_config)
                ctx = AgentWorkflowContext(
                    prompt=request.prompt,
                    config=config,
                    metadata=request.metadata,
                    artifacts_dir=artifacts_dir,
                )
                workflow = self.workflow_cls(config)

                async def produce() -> RolloutSample | None:
                    output = normalize_output(await workflow.run(ctx))
                    if output is None:
                        return await rollout_ctx.get_sample()
                    if output.messages is None:
                        return None
                    return RolloutSample(
                        messages=output.messages,
                        label=request.label,
                        metrics=dict(output.metrics),
                    )

                limit = request.agent_timeout_sec
                budget = None if limit is None else max(limit - queued_sec, 0.0)
                try:
                    sample = await _within(produce, budget, "workflow", limit, queued_sec)
                except Exception as exc:
                    return _failure(exc, "workflow", request, rollout_ctx), artifacts_dir
                finally:
                    await rollout_ctx.run_cleanups()
                if sample is not None and sample.label is None:
                    sample.label = request.label
                return Result(status=RolloutStatus.SUCCESS, sample=sample), artifacts_dir
        finally:
            self._workflows.release()

    async def _run_grader(
        self,
        request: ExecutionRequest,
        sample: RolloutSample | None,
        artifacts_dir: Path | None,
    ) -> Result:
        assert self.grader_cls is not None
        with self._rollout_context(request) as rollout_ctx:
            problem = _ungradable_reason(request, sample)
            if problem is not None:
                return _failure(GradingError(problem), "grader", request, rollout_ctx, sample)
            await self._graders.acquire()
            try:
                rollout_ctx.set_status(RolloutStatus.GRADING)
                config = copy.deepcopy(self.grader_config)
                ctx = GraderContext(
                    label=request.label,
                    sample=sample,
                    metadata=request.metadata,
                    artifacts_dir=artifacts_dir,
                )
                grader = self.grader_cls(config)

                async def grade() -> None:
                    await grader.grade(ctx)
                    _require_reward(ctx.sample)

                limit = request.grader_timeout_sec
                try:
                    await _within(grade, limit, "grader", limit, 0.0)
                except Exception as exc:
                    return _failure(exc, "grader", request, rollout_ctx, sample)
                finally:
                    await rollout_ctx.run_cleanups()  # clients a grader opened
                return Result(status=RolloutStatus.SUCCESS, sample=ctx.sample)
            finally:
                self._graders.release()

    def _rollout_context(self, request: ExecutionRequest) -> RolloutContext:
        # The server installs one context per rollout; a custom harness may not, and then
        # each rollout gets a fresh one (endpoint and key from the OSMOSIS_* variables).
        ambient = get_rollout_context()
        if ambient is not None and ambient.rollout_id in ("", request.id):
            return ambient
        return RolloutContext(
            chat_completions_url=ambient.chat_completions_url if ambient else "",
            api_key=ambient.api_key if ambient else None,
            rollout_id=request.id,
        )


async def _within(
    body: Callable[[], Awaitable[T]],
    budget: float | None,
    phase: str,
    limit: float | None,
    queued_sec: float,
) -> T:
    """Run ``body`` under a deadline that also catches blocked loops and swallowed cancels."""
    started = time.monotonic()
    deadline: asyncio.Timeout | None = None
    try:
        if budget is None:
            return await body()
        async with asyncio.timeout(budget) as deadline:
            value = await body()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # a real cancellation (lease expiry, cancel request, shutdown)
        # User code awaited something that was cancelled; that is its failure, not ours.
        raise RolloutFailure(
            f"{phase} raised CancelledError although the rollout was not cancelled "
            "(an awaited task or future inside it was cancelled)"
        ) from None
    except Exception as exc:
        # Past the deadline, whatever the body raised (a TimeoutError, or a missing reward
        # after it swallowed the cancellation) is a consequence of being interrupted.
        if _missed(deadline, started, budget):
            raise _PhaseDeadline(phase, limit, queued_sec) from exc
        raise  # a TimeoutError of the user's own keeps its message
    # The body returned although the deadline was missed: still a timeout.
    if _missed(deadline, started, budget):
        raise _PhaseDeadline(phase, limit, queued_sec)
    return value


def _missed(deadline: asyncio.Timeout | None, started: float, budget: float | None) -> bool:
    """Whether the timer fired (even if the body swallowed its cancellation), or the body
    never yielded to the loop so the timer could not fire."""
    if deadline is None or budget is None:
        return False
    return deadline.expired() or time.monotonic() - started > budget


def _ungradable_reason(request: ExecutionRequest, sample: RolloutSample | None) -> str | None:
    if sample is None:
        return (
            "no sample to grade: run() returned None and no sample source was registered "
            "(construct an Osmosis agent or session inside run(), or return the messages)"
        )
    if request.label is None and request.metadata is None:
        return (
            "cannot grade: the request has neither a label nor metadata; give the dataset row "
            "a ground_truth or a metadata object, or send grade=false"
        )
    return None


def _require_reward(sample: RolloutSample | None) -> None:
    if sample is not None and sample.reward is None and not sample.remove_sample:
        raise GradingError(
            "the grader finished without a reward; call ctx.set_reward(<number>) or set "
            "ctx.sample.remove_sample = True to exclude the sample"
        )


def _failure(
    exc: BaseException,
    phase: str,
    request: ExecutionRequest,
    rollout_ctx: RolloutContext,
    sample: RolloutSample | None = None,
) -> Result:
    # The secrets of the server (or run) this backend serves, and the rollout's key.
    redactor = rollout_ctx.redactor
    category = categorize(exc)
    # Our own failures already read as sentences; user exceptions get phase and type.
    own = isinstance(exc, _PhaseDeadline | GradingError | RolloutFailure)
    message = redactor.text(str(exc) if own else describe(exc, phase=phase))
    trace = redactor.text("".join(traceback.format_exception(exc)))
    logger.warning("rollout %s: %s", request.id, message)
    logger.debug("rollout %s: %s traceback:\n%s", request.id, phase, trace)
    return Result(
        status=RolloutStatus.FAILURE,
        sample=sample,
        err_message=message,
        err_category=category,
        extra_fields={
            "backend": "local",
            "phase": phase,
            "exception_type": type(exc).__name__,
            "traceback": trace,
        },
    )
