"""Rollouts of a training run through the rollout stack: one rollout of a row (graded, its
call records taken from the gateway, its line in ``rollouts.jsonl``), a step's rollouts all in
flight at once (each group scored by the group judge when the run has one), and a held-out
evaluation."""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from osmosis_ai.errors import OsmosisError
from osmosis_ai.eval.datasets import DatasetItem
from osmosis_ai.eval.group_judge import group_judging, judge_group
from osmosis_ai.eval.metrics import failure_line, pass_at_k, passes
from osmosis_ai.eval.stack import RolloutStack
from osmosis_ai.gateway.records import CallRecord
from osmosis_ai.redact import Redactor
from osmosis_ai.rollout.scrub import scrub_files
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.rollout.types import RolloutResultResponse
from osmosis_ai.train.algorithm.sequences import RolloutRecords
from osmosis_ai.train.bookkeeping.journal import append
from osmosis_ai.train.bookkeeping.trackers import Trackers
from osmosis_ai.train.config import TrainConfig
from osmosis_ai.train.generation.generator import Generator
from osmosis_ai.train.loop.outcome import EvalPoint, TrainHooks, TrainingStopped
from osmosis_ai.train.loop.rows import group_id
from osmosis_ai.train.run_files import RUN_FILES

__all__ = ["Run", "held_out_pass_at_k", "rollout_reward", "rollout_status"]

_ROLLOUT_DEADLINE_SEC = 900.0


@dataclass
class Run:
    """What a run's rollouts go through (the rollout stack, served by the engine's generator)
    and where their lines, evaluations and messages go."""

    config: TrainConfig
    run_dir: Path
    items: list[DatasetItem]
    generator: Generator
    stack: RolloutStack
    log: logging.Logger
    hooks: TrainHooks
    redactor: Redactor
    trackers: Trackers
    semaphore: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self.semaphore = asyncio.Semaphore(self.config.training.rollouts_in_flight)

    async def rollout(
        self, row: int, rollout_id: str, sampling: dict[str, Any] | None = None
    ) -> _Finished:
        """One rollout of ``row``, graded, with its call records (taken from the gateway);
        ``sampling`` replaces the gateway's imposed sampling for its calls."""
        item, gateway = self.items[row], self.stack.gateway
        async with self.semaphore:
            if sampling is not None:
                gateway.impose_sampling(rollout_id, sampling)
            version = self.generator.engine.version
            handle = await self.stack.client.run_rollout(
                item.prompt,
                gateway.chat_completions_url(rollout_id),
                rollout_id,
                llm_api_key=gateway.token,
                label=item.label,
                metadata=item.metadata,
                extra_fields={"trajectory_report_url": gateway.trajectory_report_url(rollout_id)},
            )
            async with asyncio.timeout(_ROLLOUT_DEADLINE_SEC):
                result = await handle
        calls = gateway.records.take(rollout_id)
        # The rollout's files (trajectory, artifacts) may quote the key or a secret.
        secrets = self.redactor.secrets
        await asyncio.to_thread(
            scrub_files, self.run_dir / RUN_FILES.rollouts / rollout_id, secrets
        )
        done = _Finished(result, calls, row, version)
        if not self._group_judged:  # under the group judge, once it has scored the group
            await self._write_line(done)
        return done

    @property
    def _group_judged(self) -> bool:
        return group_judging(self.stack.gateway.judge, self.config.judge)

    async def _write_line(self, done: _Finished) -> None:
        line = _rollout_line(done, self.redactor)
        await asyncio.to_thread(append, self.run_dir / RUN_FILES.rollout_lines, line)

    async def _judged(self, finished: list[_Finished]) -> list[_Finished]:
        """``finished`` with each group's rewards given by the group judge, and their lines
        written: one call per group, as soon as its rollouts are in (so it overlaps the
        updates that ``max_staleness`` lets run meanwhile; a group run again is judged
        again)."""
        judge, config = self.stack.gateway.judge, self.config.judge
        assert judge is not None and config is not None
        groups: dict[str, list[int]] = {}
        for index, done in enumerate(finished):
            groups.setdefault(group_id(done.row), []).append(index)

        async def judged(indices: list[int]) -> None:
            group = [finished[index] for index in indices]
            results = await judge_group(
                judge,
                config,
                [done.result for done in group],
                label=self.items[group[0].row].label,
                files=self.run_dir / RUN_FILES.rollouts,
            )
            for index, result in zip(indices, results, strict=True):
                finished[index] = replace(finished[index], result=result)
                await self._write_line(finished[index])

        await asyncio.gather(*(judged(indices) for indices in groups.values()))
        return finished

    async def rollouts(
        self, jobs: list[tuple[int, str]], sampling: dict[str, Any] | None = None
    ) -> list[RolloutRecords]:
        """All of ``jobs`` at once (the policy batches their calls), with ``sampling`` imposed
        on their calls if given.

        Raises:
            TrainingStopped: The server died (its rollouts' results are then failures that
                say nothing about the policy) or a rollout could not be run.
        """
        server = self.stack.server
        exited: asyncio.Future[Any] = asyncio.ensure_future(server.wait())
        engine_died: asyncio.Future[None] = asyncio.ensure_future(self.generator.died())
        running: asyncio.Future[Any] = asyncio.gather(
            *(self.rollout(row, rid, sampling) for row, rid in jobs)
        )
        try:
            await asyncio.wait((running, exited, engine_died), return_when=asyncio.FIRST_COMPLETED)
            if exited.done() or server.exited:
                raise TrainingStopped(f"the rollout server exited with status {server.returncode}")
            if self.generator.lost:  # its calls failed: the rollouts say nothing
                raise TrainingStopped(await self.generator.why_lost())
            finished: list[_Finished] = await running
            if self._group_judged:
                finished = await self._judged(finished)
            if self.generator.engine.out_of_memory:  # its calls failed: the rollouts say nothing
                raise TrainingStopped(
                    "out of memory generating the rollouts; lower [sampling] max_tokens (now "
                    f"{self.config.sampling.max_tokens}) so each call's cache holds fewer tokens"
                )
            return [done.records for done in finished]
        except (OsmosisError, OSError, TimeoutError) as exc:
            if isinstance(exc, TrainingStopped):
                raise
            # The server stopped answering: the step's rollouts are incomplete.
            raise TrainingStopped(
                f"a rollout could not finish ({exc or type(exc).__name__})"
            ) from None
        finally:
            for task in (running, exited, engine_died):
                task.cancel()
            await asyncio.gather(running, exited, engine_died, return_exceptions=True)

    async def evaluate(self, step: int, held_out: list[int]) -> EvalPoint:
        """Pass rate and mean reward of ``[eval] samples`` rollouts per held-out row, sampled
        at ``[eval] temperature`` (greedy by default, so that two points compare policies, not
        luck); with several samples, pass@1..k as ``osmosis eval`` estimates it."""
        gateway, held = self.stack.gateway, self.config.eval
        samples = held.samples
        jobs = [
            (row, f"eval-{step:04d}-row-{row}" + (f"-{index}" if samples > 1 else ""))
            for row in held_out
            for index in range(samples)
        ]
        # Imposed on these rollouts alone: training rollouts may run beside them.
        done = await self.rollouts(jobs, {**gateway.sampling, "temperature": held.temperature})
        if all(r.result.status is not RolloutStatus.SUCCESS for r in done):
            # A pass rate of 0 would read as a policy that fails the task.
            failures = [(_category(r.result), r.result.err_message) for r in done]
            raise TrainingStopped(
                f"held-out evaluation after step {step}: {failure_line(failures, len(done))}"
            )
        rewards = [rollout_reward(r.result) for r in done]
        threshold = held.pass_threshold
        passed = [
            passes(rollout_status(r.result), reward, threshold)
            for r, reward in zip(done, rewards, strict=True)
        ]
        point = EvalPoint(
            step,
            sum(passed) / len(passed),
            statistics.fmean(x or 0.0 for x in rewards),
            held_out_pass_at_k(passed, samples) if samples > 1 else {},
        )
        await asyncio.to_thread(append, self.run_dir / RUN_FILES.events, point.to_json())
        await asyncio.to_thread(self.trackers.log, point.scalars(), step)
        self.hooks.eval_done(point)
        return point


def held_out_pass_at_k(passed: Sequence[bool], samples: int) -> dict[int, float]:
    """pass@1..``samples`` of outcomes listed row by row, ``samples`` per row: the mean over
    the rows of the unbiased estimate (`pass_at_k`)."""
    rows = [passed[start : start + samples] for start in range(0, len(passed), samples)]
    return {
        k: statistics.fmean(pass_at_k(samples, sum(row), k) for row in rows)
        for k in range(1, samples + 1)
    }


def rollout_reward(result: RolloutResultResponse) -> float | None:
    sample = result.sample
    return sample.reward if sample is not None and result.status is RolloutStatus.SUCCESS else None


def rollout_status(result: RolloutResultResponse) -> str:
    if result.status is not RolloutStatus.SUCCESS:
        return "failed"
    return "skipped" if result.sample is not None and result.sample.remove_sample else "success"


def _category(result: RolloutResultResponse) -> str | None:
    return result.err_category.value if result.err_category else None


@dataclass(frozen=True)
class _Finished:
    """A rollout that ended: its result and calls, its row, and the weight version it
    started with."""

    result: RolloutResultResponse
    calls: list[CallRecord]
    row: int
    version: int

    @property
    def records(self) -> RolloutRecords:
        """What the trainer learns from."""
        return RolloutRecords(result=self.result, group_id=group_id(self.row), calls=self.calls)


def _rollout_line(done: _Finished, redactor: Redactor) -> dict[str, Any]:
    """A finished rollout's line of ``rollouts.jsonl`` (what the viewer lists per step)."""
    result, calls = done.result, done.calls
    failed = result.status is not RolloutStatus.SUCCESS
    return {
        "rollout_id": result.rollout_id,
        "row": done.row,
        "status": rollout_status(result),
        "reward": rollout_reward(result),
        "tokens": sum(int((call.usage or {}).get("total_tokens") or 0) for call in calls),
        # The weight versions its calls were generated with (the steps applied before).
        "policy_versions": sorted({c.policy_version for c in calls} - {None}),
        "error_type": _category(result) if failed else None,
        "error_message": redactor.text(result.err_message) if result.err_message else None,
        "started_version": done.version,
    }
