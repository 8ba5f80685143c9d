"""One training step, top down (`run_step`): the step's rollout groups taken from the
producer, its batch (`prepare_batch`; groups with all-equal rewards run again), the learner's
update inside the engine's ``updating()``, the new weights pushed to the engine and checked by
the probe; then its report (`StepReport`), and what the run says about it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from osmosis_ai.errors import PolicyError
from osmosis_ai.eval.runner import CALL_THE_GATEWAY
from osmosis_ai.gateway.policies.engines.vllm import VllmEngineError
from osmosis_ai.train.algorithm.distill import reverse_kl
from osmosis_ai.train.algorithm.sequences import Exclusion, RolloutRecords
from osmosis_ai.train.bookkeeping.sequence_record import write_step_sequences
from osmosis_ai.train.generation.probe import WeightProbe
from osmosis_ai.train.learner.core import Learner
from osmosis_ai.train.loop.admission import StalenessBound
from osmosis_ai.train.loop.batch import StepBatch, distilled, prepare_batch
from osmosis_ai.train.loop.group_queue import TakenGroups
from osmosis_ai.train.loop.outcome import TrainingStopped
from osmosis_ai.train.loop.report import StepReport, StepTimes
from osmosis_ai.train.loop.rollouts import Run
from osmosis_ai.train.loop.rows import group_id, jobs

__all__ = [
    "EQUAL_REWARDS",
    "FlatStepsHint",
    "excluded_text",
    "probing",
    "run_step",
]

#: Why a step had nothing to update when every group was filtered out.
EQUAL_REWARDS = "every group's rewards were equal"
#: Why a step that ran its update applied none (`StepMetrics.updates` 0).
_NO_GRADIENT = "no token had a gradient (each was masked by tis_mode or had no advantage)"


async def run_step(
    run: Run,
    learner: Learner,
    taking: Awaitable[TakenGroups],
    step: int,
    *,
    bound: StalenessBound,
    probe: WeightProbe,
) -> StepReport:
    """Train step ``step`` on the groups ``taking`` gives (the producer's, oldest first):
    its batch, its update inside the engine's ``updating()``, the new weights pushed and
    probed.

    Raises:
        TrainingStopped: The rollouts could not finish, the update ran out of memory, or the
            engine did not take the new weights.
        NonFiniteStepError: The update's loss or gradient is not finite.
    """
    engine = run.generator.engine
    started, busy, judged = time.monotonic(), engine.busy_sec, _judge_counts(run)
    taken = await taking
    done, batch, resampled, dropped = await _sample(run, learner, step, taken)
    generated = time.monotonic()
    _check_batch(batch, step, learner.settings.token_budget)
    if step <= run.config.tracking.record_sequences:
        await asyncio.to_thread(
            write_step_sequences, run.run_dir, step, batch.sequences,
            zero_gradient=batch.zero_gradient, decode=learner.tokenizer.decode,
            redact=run.redactor.text,
        )  # fmt: skip
    batch, distill = await _distilled(run, learner, batch)
    bound.check(step, batch.versions)
    built = time.monotonic()
    metrics, sync_sec, probe_gap = None, 0.0, None
    no_update = _nothing_to_train(batch, learner)
    if no_update is not None:  # the weights stay: version ``step`` is the previous one's
        engine.version = step
    else:
        # No model call runs while the optimizer changes the weights the engine serves.
        async with engine.updating(version=step) as update:
            metrics = await learner.update(batch.trained, batch.advantages, step)
            if not metrics.updates:
                no_update = _NO_GRADIENT
            _warn_unreplayed(run, step, metrics.unreplayed_tokens)
            pushing = time.monotonic()
            try:
                await update.push(learner.model)
            except VllmEngineError as exc:  # the engine still has the old weights
                raise TrainingStopped(f"the new weights did not reach vLLM: {exc}") from None
            sync_sec = time.monotonic() - pushing
        # After the version changed: the probe's call must be generated with the new weights.
        probe_gap = await probing(run, probe.check(step))
    ended = time.monotonic()
    # The engine counts a batch's time once the batch ends, which the update waited for.
    generating = engine.busy_sec - busy
    # The learner's thread updates and, for the torch engine, generates while it waits.
    learner_busy = (ended - built) + (generating if run.generator.on_learner_thread else 0.0)
    times = StepTimes(
        generation=generated - started,
        sequences=built - generated,
        update=ended - built,
        weight_sync=sync_sec,
        policy_busy=generating,
        learner_busy=learner_busy,
    )
    return StepReport(
        step=step,
        done=done,
        batch=batch,
        metrics=metrics,
        no_update=no_update,
        times=times,
        pass_threshold=run.config.eval.pass_threshold,
        tokens_generated=batch.stats.policy_tokens + dropped,
        resampled_groups=resampled,
        groups_waited=taken.waited,
        probe_gap=probe_gap,
        memory=learner.peak_memory(),
        signals={**judged(), **distill},
    )


def _judge_counts(run: Run) -> Callable[[], dict[str, float]]:
    """What the run's judge does from now until the returned function is called, as the step's
    ``judge_*`` metrics (``{}`` without a judge)."""
    judge = run.stack.gateway.judge
    if judge is None:
        return dict
    before = judge.usage.copy()
    return lambda: judge.usage.since(before).metrics()


async def _distilled(
    run: Run, learner: Learner, batch: StepBatch
) -> tuple[StepBatch, dict[str, float | None]]:
    """``batch`` with the teacher's advantages under ``[algorithm.distill]``, and the step's
    ``teacher_reverse_kl`` and ``teacher_sec`` (``{}``: the run distils from no teacher)."""
    distill = run.config.algorithm.distill
    if distill is None:
        return batch, {}
    if not batch.trained:
        return batch, {"teacher_reverse_kl": None, "teacher_sec": 0.0}
    started = time.monotonic()
    teacher = await learner.teacher_logprobs(batch.trained)
    seconds = round(time.monotonic() - started, 3)
    kl = reverse_kl(batch.trained, teacher)
    return distilled(batch, teacher, distill), {"teacher_reverse_kl": kl, "teacher_sec": seconds}


async def _sample(
    run: Run, learner: Learner, step: int, taken: TakenGroups
) -> tuple[list[RolloutRecords], StepBatch, int, int]:
    """The step's rollouts and their batch; groups with all-equal rewards run again (with
    the current weights, so within any staleness bound), up to ``resample_zero_gradient``
    times. Also the groups run again, and the policy tokens of the attempts replaced."""
    done = taken.rollouts
    batch = prepare_batch(done, learner.settings)
    rows = sorted({int(r.group_id.removeprefix("row-")) for r in done})
    resampled = dropped = 0
    for attempt in range(1, run.config.algorithm.resample_zero_gradient + 1):
        if not batch.zero_gradient:
            break
        again = [r for r in rows if group_id(r) in batch.zero_gradient]
        size = run.config.training.group_size
        fresh = await run.rollouts(jobs(f"step-{step:04d}-resample-{attempt}", again, size))
        dropped += batch.dropped_tokens()
        done = [d for d in done if d.group_id not in batch.zero_gradient] + fresh
        batch = prepare_batch(done, learner.settings)
        resampled += len(again)
    return done, batch, resampled, dropped


def excluded_text(excluded: Mapping[str, int]) -> str:
    """``failed 2, no_calls 1``: rollouts left out of training, by cause (`Exclusion`)."""
    return ", ".join(f"{cause} {count}" for cause, count in sorted(excluded.items()))


def _check_batch(batch: StepBatch, step: int, budget: int) -> None:
    """Refuse a step no update can run: every rollout made no model call, or a sequence no
    micro-batch can hold (named by the config keys: ``train_step`` would name its own
    parameter, which the user never wrote)."""
    stats = batch.stats
    if stats.rollouts and stats.excluded[Exclusion.NO_CALLS] == stats.rollouts:
        raise TrainingStopped(
            f"every rollout of step {step} made no model call through the gateway, so there "
            f"is nothing to train: {CALL_THE_GATEWAY}"
        )
    longest = max((len(sequence) for sequence in batch.trained), default=0)
    if longest > budget:
        raise TrainingStopped(
            f"a sequence of step {step} has {longest} tokens, more than [learner] token_budget "
            f"({budget}); raise token_budget or lower [sampling] max_tokens"
        )


def _nothing_to_train(batch: StepBatch, learner: Learner) -> str | None:
    """Why the step has no update to run (``None``: it has one), said in its metrics line."""
    from osmosis_ai.train.algorithm.update import carries_loss

    if not batch.stats.sequences:
        return f"every rollout was left out ({excluded_text(batch.stats.excluded)})"
    if not batch.trained:
        return EQUAL_REWARDS
    if not carries_loss(batch.trained, learner.settings):
        return (
            "every trained rollout stopped at max_tokens and [algorithm.overlong] "
            'mode = "mask" leaves it out'
        )
    return None


def _warn_unreplayed(run: Run, step: int, tokens: int) -> None:
    if tokens:
        run.log.warning(
            "step %d: %d tokens generated under a grammar did not replay under it (scored "
            "without its mask); the engine enforced another grammar",
            step,
            tokens,
        )


async def probing(run: Run, probe: Awaitable[float]) -> float:
    """The probe's gap; an engine that failed to answer it stops the run, saying why."""
    try:
        return await probe
    except PolicyError as exc:
        if run.generator.lost:
            raise TrainingStopped(await run.generator.why_lost()) from None
        raise TrainingStopped(f"the weight probe's call failed: {exc}") from None


class FlatStepsHint:
    """Says once when most groups of several steps in a row had all-equal rewards (such
    groups give no gradient, so those steps train little), with the setting that helps."""

    IN_A_ROW = 3

    def __init__(self, groups: int, resample: int) -> None:
        self._groups, self._resample = groups, resample
        self._row = 0
        self._said = False

    def after(self, metrics: Mapping[str, Any]) -> str | None:
        """The hint to print after a step's line, or ``None``."""
        flat = 2 * int(metrics.get("zero_gradient_groups") or 0) > self._groups
        self._row = self._row + 1 if flat else 0
        if self._said or self._row < self.IN_A_ROW:
            return None
        self._said = True
        fix = (
            f"raise [algorithm] resample_zero_gradient (now {self._resample}) or [training] "
            "group_size"
            if self._resample
            else 'set [algorithm] resample_zero_gradient = 2 (or recipe = "dapo") to run such '
            "groups again within the step"
        )
        return (
            f"most groups had all-equal rewards in {self._row} steps in a row (no gradient: "
            f"those steps train little); {fix}"
        )
