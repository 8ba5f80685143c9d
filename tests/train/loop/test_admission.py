"""The staleness bound and the queue between producer and consumer, without a model."""

from __future__ import annotations

import asyncio

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.rollout.types import RolloutResultResponse
from osmosis_ai.train.algorithm.sequences import RolloutRecords
from osmosis_ai.train.loop.admission import StalenessBound, staleness_stats
from osmosis_ai.train.loop.group_queue import GroupQueue, InFlightGroup
from osmosis_ai.train.loop.outcome import TrainingStopped


@pytest.mark.parametrize(
    ("staleness", "admits_after"),
    [(0, [0, 1, 2, 3]), (1, [-1, 0, 1, 2]), (2, [-2, -1, 0, 1])],
)
def test_a_step_starts_once_the_step_s_plus_one_before_it_is_finished(
    staleness: int, admits_after: list[int]
) -> None:
    bound = StalenessBound(staleness, groups_per_step=4)
    assert [bound.admits_after(step) for step in (1, 2, 3, 4)] == admits_after
    assert bound.capacity == 4 * (staleness + 1)


def test_the_bound_holds_for_every_version_its_admission_allows() -> None:
    """A group of step s starts at a version >= s - 1 - S (admission), and every token it
    generates is of that version or newer: all pass the check; one version older does not."""
    for staleness in range(4):
        bound = StalenessBound(staleness, groups_per_step=2)
        for step in range(1, 9):
            oldest = max(0, bound.admits_after(step))
            bound.check(step, range(oldest, step))
            if oldest > 0:
                with pytest.raises(TrainingStopped, match="more than max_staleness"):
                    bound.check(step, [oldest - 1])


def test_staleness_stats_count_turns_against_the_weights_a_step_updates() -> None:
    # Step 5 updates version 4: turns of versions 4, 3, 3 are 0, 1, 1 stale.
    mean, most = staleness_stats(5, [4, 3, 3])
    assert mean == pytest.approx(2 / 3) and most == 1
    assert staleness_stats(5, []) == (None, None)


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_a_bad_max_staleness_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="max_staleness"):
        StalenessBound(value, groups_per_step=1)  # type: ignore[arg-type]


def _records(row: int) -> list[RolloutRecords]:
    result = RolloutResultResponse(rollout_id=f"r{row}", status=RolloutStatus.SUCCESS)
    return [RolloutRecords(result=result, group_id=f"row-{row}", calls=[])]


async def _finishes(row: int, after: asyncio.Event) -> list[RolloutRecords]:
    await after.wait()
    return _records(row)


async def test_a_step_takes_its_groups_oldest_first_waiting_for_stragglers() -> None:
    queue = GroupQueue(capacity=4)
    fast, slow = asyncio.Event(), asyncio.Event()
    fast.set()
    groups = [
        InFlightGroup(1, 10, 0, asyncio.create_task(_finishes(10, slow))),
        InFlightGroup(1, 11, 0, asyncio.create_task(_finishes(11, fast))),
        InFlightGroup(2, 12, 0, asyncio.create_task(_finishes(12, fast))),
    ]
    for group in groups:
        await queue.put(group)
    await asyncio.sleep(0)
    taking = asyncio.create_task(queue.take(1, 2))
    await asyncio.sleep(0.05)
    assert not taking.done(), "step 1 waits for its slow group, not step 2's finished one"
    slow.set()
    taken = await taking
    assert [r.group_id for r in taken.rollouts] == ["row-10", "row-11"]
    assert taken.waited == 1
    assert len(queue) == 1


async def test_a_full_queue_holds_the_producer_back_and_cancel_stops_the_running() -> None:
    queue = GroupQueue(capacity=1)
    never = asyncio.Event()
    first = asyncio.create_task(_finishes(1, never))
    await queue.put(InFlightGroup(1, 1, 0, first))
    second = asyncio.create_task(_finishes(2, never))
    putting = asyncio.create_task(queue.put(InFlightGroup(1, 2, 0, second)))
    await asyncio.sleep(0.02)
    assert not putting.done() and len(queue) == 1
    assert await queue.cancel() == 1 and first.cancelled()
    await putting  # room again
    assert await queue.cancel() == 1 and second.cancelled()
