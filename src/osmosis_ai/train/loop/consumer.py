"""The consumer: the loop that trains. It takes each step's rollout groups from the producer
(oldest first, waiting for stragglers), applies the step (`run_step`), journals it, saves a
checkpoint and runs the held-out evaluation when due, then tells the producer the step is
finished, which admits the rollouts the staleness bound held back.

Checkpoints and evaluations run between two steps, after the new weights reached the engine:
they see whole weights, never half-updated ones, while rollouts of later steps go on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

from osmosis_ai.train.bookkeeping.journal import append, last_checkpoint, read_lines
from osmosis_ai.train.bookkeeping.trackers import scalars
from osmosis_ai.train.generation.probe import WeightProbe
from osmosis_ai.train.learner.checkpoints import checkpoint
from osmosis_ai.train.learner.core import Learner
from osmosis_ai.train.loop.admission import StalenessBound
from osmosis_ai.train.loop.outcome import TrainingStopped, TrainOutcome
from osmosis_ai.train.loop.producer import Producer
from osmosis_ai.train.loop.report import step_seconds
from osmosis_ai.train.loop.rollouts import Run
from osmosis_ai.train.loop.step import FlatStepsHint, probing, run_step
from osmosis_ai.train.run_files import RUN_FILES

__all__ = ["train_steps"]

T = TypeVar("T")


async def train_steps(
    run: Run, learner: Learner, outcome: TrainOutcome, train_rows: list[int], held_out: list[int]
) -> None:
    """Train from ``outcome.steps_done + 1`` to the last step (or ``max_minutes``).

    Raises:
        TrainingStopped: A step could not be applied (journaled as ``stopped``; the steps
            before it stay checkpointed).
    """
    training, run_dir = run.config.training, run.run_dir
    if not any(point.step == outcome.steps_done for point in outcome.evals):
        await _evaluate(run, outcome, outcome.steps_done, held_out)
    metrics_path = run_dir / RUN_FILES.metrics
    spent = sum(map(step_seconds, await asyncio.to_thread(read_lines, metrics_path)))
    if training.max_minutes and spent >= training.max_minutes * 60:
        run.hooks.message(
            f"nothing to do: the steps already took max_minutes ({spent / 60:.1f} min)"
        )
        return
    run.hooks.started(outcome.steps_done + 1, training.steps)
    flat_steps = FlatStepsHint(
        training.prompts_per_step, run.config.algorithm.resample_zero_gradient
    )
    bound = StalenessBound(training.max_staleness, min(training.prompts_per_step, len(train_rows)))
    probe = WeightProbe(run.generator.engine, learner)
    first = outcome.steps_done + 1
    # Before any rollout: engine and learner hold the weights of version first - 1.
    await _guarded(run, first, outcome, probing(run, probe.calibrate(first - 1)))
    began = time.monotonic()
    async with Producer(run, train_rows, bound, first=first, last=training.steps) as producer:
        for step in range(first, training.steps + 1):
            taking = producer.take(step)
            stepping = run_step(run, learner, taking, step, bound=bound, probe=probe)
            report = await _guarded(run, step, outcome, stepping)
            metrics = report.line()
            # Wall time since this session's first step began (steps overlap when async).
            metrics["elapsed_sec"] = round(time.monotonic() - began, 3)
            await asyncio.to_thread(append, metrics_path, metrics)
            await asyncio.to_thread(append, run_dir / RUN_FILES.events, report.journal_record())
            await asyncio.to_thread(run.trackers.log, scalars(metrics), step)
            run.hooks.step_done(metrics)
            hint = flat_steps.after(metrics)
            if hint:
                run.hooks.message(hint)
                run.log.info("%s", hint)
            outcome.steps_done = step
            spent += step_seconds(metrics)
            out_of_time = bool(training.max_minutes) and spent >= training.max_minutes * 60
            last = step == training.steps or out_of_time
            saves, held = run.config.checkpoints, run.config.eval
            if step % saves.every == 0 or last:
                await learner.run(checkpoint, learner, run_dir, step, saves.keep)
            if (held.every and step % held.every == 0) or last:
                await _evaluate(run, outcome, step, held_out)
            if out_of_time:
                run.hooks.message(
                    f"stopped after step {step}: the steps took {spent / 60:.1f} min "
                    f"(max_minutes = {training.max_minutes:g})"
                )
                return
            await producer.finished(step)


async def _guarded(run: Run, step: int, outcome: TrainOutcome, work: Awaitable[T]) -> T:
    """``work`` of step ``step``; a step that cannot be applied is journaled as ``stopped``."""
    from osmosis_ai.train.algorithm.update import NonFiniteStepError

    try:
        return await work
    except (NonFiniteStepError, TrainingStopped) as exc:
        run_dir = run.run_dir
        last = last_checkpoint(await asyncio.to_thread(read_lines, run_dir / RUN_FILES.events))
        # Redacted: an error from the rollout server or a workflow may quote a secret.
        reason = run.redactor.text(
            f"{exc}; step {step} was not applied, the last checkpoint is step {last}"
        )
        stopped = {"event": "stopped", "step": step, "reason": reason}
        await asyncio.to_thread(append, run_dir / RUN_FILES.events, stopped)
        raise TrainingStopped(reason, outcome) from None


async def _evaluate(run: Run, outcome: TrainOutcome, step: int, held_out: list[int]) -> None:
    """The held-out evaluation after ``step``, added to ``outcome``; one that cannot run (its
    rollouts all failed, the server died) stops the run, recorded in the journal."""
    try:
        outcome.evals.append(await run.evaluate(step, held_out))
    except TrainingStopped as exc:
        reason = run.redactor.text(f"{exc}; run the same command to resume")
        stopped = {"event": "stopped", "step": step, "reason": reason}
        await asyncio.to_thread(append, run.run_dir / RUN_FILES.events, stopped)
        raise TrainingStopped(reason, outcome) from None
