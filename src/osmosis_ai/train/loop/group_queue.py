"""The bounded queue between the producer of rollout groups and the consumer that trains on
them: groups in the order they were admitted, each one unit (its rollouts, in flight or
done), taken oldest first."""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass

from osmosis_ai.train.algorithm.sequences import RolloutRecords

__all__ = ["GroupQueue", "InFlightGroup", "TakenGroups"]


@dataclass(frozen=True)
class InFlightGroup:
    """One row's ``group_size`` rollouts for ``step``, started at weight version ``version``."""

    step: int
    row: int
    version: int
    rollouts: asyncio.Task[list[RolloutRecords]]


@dataclass(frozen=True)
class TakenGroups:
    """A step's groups, finished, and what waiting for them cost the consumer."""

    rollouts: list[RolloutRecords]
    waited: int
    """Groups still running when the consumer asked for them (stragglers it waited for)."""


class GroupQueue:
    """Groups admitted and not yet trained, at most ``capacity`` of them.

    The producer `put`\\ s groups in admission order (waiting while the queue is full); the
    consumer `take`\\ s a step's groups, oldest first, waiting for the ones still running.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, not {capacity}")
        self.capacity = capacity
        self._groups: collections.deque[InFlightGroup] = collections.deque()
        self._changed = asyncio.Condition()

    def __len__(self) -> int:
        return len(self._groups)

    async def put(self, group: InFlightGroup) -> None:
        """Add ``group`` after the others, once there is room."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._groups) < self.capacity)
            self._groups.append(group)
            self._changed.notify_all()

    async def take(self, step: int, count: int) -> TakenGroups:
        """The oldest ``count`` groups, which must be ``step``'s, once all have finished.

        Raises:
            Exception: What a group's rollouts raised (the server died...): the step cannot
                be trained.
        """
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._groups) >= count)
            groups = [self._groups.popleft() for _ in range(count)]
            self._changed.notify_all()
        wrong = [group.step for group in groups if group.step != step]
        if wrong:  # the producer admits steps in order: a bug, not a user error
            raise RuntimeError(f"step {step} was handed groups of steps {sorted(set(wrong))}")
        waited = sum(1 for group in groups if not group.rollouts.done())
        try:
            done = await asyncio.gather(*(group.rollouts for group in groups))
        except BaseException:
            for group in groups:
                group.rollouts.cancel()
            raise
        rollouts = [rollout for group in done for rollout in group]
        return TakenGroups(rollouts, waited)

    async def cancel(self) -> int:
        """Stop every group still queued (the run is stopping); returns how many were running."""
        async with self._changed:
            groups = list(self._groups)
            self._groups.clear()
            self._changed.notify_all()
        running = [group.rollouts for group in groups if not group.rollouts.done()]
        for task in running:
            task.cancel()
        await asyncio.gather(*(group.rollouts for group in groups), return_exceptions=True)
        return len(running)
