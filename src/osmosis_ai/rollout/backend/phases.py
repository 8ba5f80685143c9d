"""The two phases of a rollout, run in this process: the workflow, then the grader.

Plain functions over a `RolloutSpec`: `LocalBackend` calls them with a directory under its
artifact root, the in-container runner with the directory its harness collects.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from osmosis_ai.errors import DeadlineExceeded, GradingError, RolloutFailure
from osmosis_ai.rollout._failures import categorize, describe
from osmosis_ai.rollout.backend._limiter import ConcurrencyLimiter
from osmosis_ai.rollout.backend.base import ExecutionRequest
from osmosis_ai.rollout.backend.base import ExecutionResult as Result
from osmosis_ai.rollout.context import (
    AgentWorkflowContext,
    GraderContext,
    RolloutContext,
    get_rollout_context,
)
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.spec import RolloutSpec
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.rollout.workflow import normalize_output

__all__ = ["run_grader_phase", "run_workflow_phase"]

# Failures are reported under the backend users configure logging for.
logger = logging.getLogger("osmosis_ai.rollout.backend.local")

T = TypeVar("T")

# Queue waits shorter than this are not worth mentioning in a deadline message.
_QUEUE_NOTE_MIN_SEC = 0.1


class _PhaseDeadline(DeadlineExceeded):
    """A phase ran past its deadline (raised by the backend, not by user code)."""

    def __init__(self, phase: str, limit: float | None, queued_sec: float) -> None:
        message = f"{phase} exceeded its {limit:g}s deadline" if limit is not None else phase
        if queued_sec >= _QUEUE_NOTE_MIN_SEC:
            message += f" ({queued_sec:.1f}s of it spent queued)"
        super().__init__(message)


async def run_workflow_phase(
    spec: RolloutSpec,
    request: ExecutionRequest,
    *,
    artifacts_dir: Path | None,
    submitted_at: float,
) -> Result:
    """Run ``spec``'s workflow for ``request`` and return the phase's result.

    Args:
        artifacts_dir: The rollout's artifacts directory (``None``: unavailable).
        submitted_at: ``time.monotonic()`` at submission; queue time counts against the
            agent deadline.

    Raises:
        ConfigError: ``spec`` has no workflow.
    """
    workflow_cls = spec.require_workflow()
    queued_sec = time.monotonic() - submitted_at
    with _rollout_context(request) as rollout_ctx:
        rollout_ctx.set_status(RolloutStatus.RUNNING)
        config = copy.deepcopy(spec.workflow_config)
        ctx = AgentWorkflowContext(
            prompt=request.prompt,
            config=config,
            metadata=request.metadata,
            artifacts_dir=artifacts_dir,
        )
        workflow = workflow_cls(config)

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
                turn_rewards=dict(output.turn_rewards),
            )

        limit = request.agent_timeout_sec
        budget = None if limit is None else max(limit - queued_sec, 0.0)
        try:
            sample = await _within(produce, budget, "workflow", limit, queued_sec)
        except Exception as exc:
            return _failure(exc, "workflow", request, rollout_ctx)
        finally:
            await rollout_ctx.run_cleanups()
        if sample is not None and sample.label is None:
            sample.label = request.label
        return Result(status=RolloutStatus.SUCCESS, sample=sample)


async def run_grader_phase(
    spec: RolloutSpec,
    request: ExecutionRequest,
    sample: RolloutSample | None,
    *,
    artifacts_dir: Path | None,
    slots: ConcurrencyLimiter | None = None,
) -> Result:
    """Grade ``sample`` with ``spec``'s grader and return the phase's result.

    The result carries the sample whatever happens, so a failed grading still shows what
    was graded.

    Args:
        artifacts_dir: The rollout's artifacts directory (``None``: unavailable).
        slots: Grader slots to hold while it runs (taken here, after the sample is known
            to be gradable: an ungradable one fails without waiting for a slot).
    """
    assert spec.grader is not None
    with _rollout_context(request) as rollout_ctx:
        problem = _ungradable_reason(request, sample)
        if problem is not None:
            return _failure(GradingError(problem), "grader", request, rollout_ctx, sample)
        if slots is not None:
            await slots.acquire()
        try:
            rollout_ctx.set_status(RolloutStatus.GRADING)
            config = copy.deepcopy(spec.grader_config)
            ctx = GraderContext(
                label=request.label,
                sample=sample,
                metadata=request.metadata,
                artifacts_dir=artifacts_dir,
            )
            grader = spec.grader(config)

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
            if slots is not None:
                slots.release()


def _rollout_context(request: ExecutionRequest) -> RolloutContext:
    # The server installs one context per rollout; a custom harness may not, and then
    # each rollout gets a fresh one (endpoint and key from the OSMOSIS_* variables).
    ambient = get_rollout_context()
    if ambient is not None and ambient.rollout_id in ("", request.id):
        return ambient
    return RolloutContext(
        chat_completions_url=ambient.chat_completions_url if ambient else "",
        api_key=ambient.api_key if ambient else None,
        rollout_id=request.id,
        model_pool=ambient.model_pool if ambient else None,
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
    category = categorize(exc, phase=phase)
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
