"""The producer of asynchronous training: starts each step's rollout groups as soon as the
staleness bound admits them, and hands them to the consumer through the bounded queue.

Step ``s``'s groups start once step ``s - 1 - max_staleness`` is finished (`StalenessBound`);
the consumer says when a step is (`Producer.finished`): applied, checkpointed and evaluated.
With ``max_staleness = 0`` a step's rollouts therefore start right after the previous step
ends, as in the synchronous loop; with ``S >= 1`` the next ``S`` steps' rollouts run while a
step updates, evaluates and checkpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Self

from osmosis_ai.train.loop.admission import StalenessBound
from osmosis_ai.train.loop.group_queue import GroupQueue, InFlightGroup, TakenGroups
from osmosis_ai.train.loop.rollouts import Run
from osmosis_ai.train.loop.rows import jobs, step_rows

__all__ = ["Producer"]


class Producer:
    """Starts the groups of steps ``first..last`` in order; an async context manager whose
    exit stops the groups still running (counted in `aborted`)."""

    def __init__(
        self, run: Run, train_rows: list[int], bound: StalenessBound, *, first: int, last: int
    ) -> None:
        self._run, self._rows, self.bound = run, train_rows, bound
        self._first, self._last = first, last
        self._queue = GroupQueue(bound.capacity)
        self._finished = first - 1
        self._progress = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self.aborted = 0
        """Groups stopped unfinished when the producer closed (the run stopped early)."""

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._produce(), name="osmosis-train-producer")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.aborted += await self._queue.cancel()

    async def finished(self, step: int) -> None:
        """Step ``step`` is applied, checkpointed and evaluated: admit the steps it held back."""
        async with self._progress:
            self._finished = step
            self._progress.notify_all()

    async def take(self, step: int) -> TakenGroups:
        """Step ``step``'s groups, finished (waiting for the ones still running).

        Raises:
            TrainingStopped: A group's rollouts could not finish (the server died...).
        """
        count = self.bound.groups_per_step
        taking = asyncio.ensure_future(self._queue.take(step, count))
        assert self._task is not None, "Producer is used outside `async with`"
        try:
            await asyncio.wait((taking, self._task), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            taking.cancel()
            raise
        if not taking.done() and self._task.exception() is not None:
            taking.cancel()  # the producer failed: the step's groups will never come
            self._task.result()
        return await taking

    async def _produce(self) -> None:
        training = self._run.config.training
        engine = self._run.generator.engine
        for step in range(self._first, self._last + 1):
            admits_after = self.bound.admits_after(step)
            async with self._progress:
                await self._progress.wait_for(lambda: self._finished >= admits_after)  # noqa: B023
            rows = step_rows(self._rows, training.prompts_per_step, training.seed, step)
            for row in rows:
                group = jobs(f"step-{step:04d}", [row], training.group_size)
                rollouts = asyncio.create_task(self._run.rollouts(group))
                await self._queue.put(InFlightGroup(step, row, engine.version, rollouts))
