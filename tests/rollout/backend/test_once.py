"""StartOnce: the lazy start() of Ray, Process and Harbor backends."""

from __future__ import annotations

import asyncio

import pytest

from osmosis_ai.rollout.backend._once import StartOnce


async def test_concurrent_callers_share_one_start() -> None:
    calls = 0
    gate = asyncio.Event()

    async def start() -> None:
        nonlocal calls
        calls += 1
        await gate.wait()

    once = StartOnce(start)
    waiters = [asyncio.create_task(once()) for _ in range(3)]
    await asyncio.sleep(0)
    gate.set()
    async with asyncio.timeout(5):
        await asyncio.gather(*waiters)
    await once()
    assert calls == 1


async def test_a_failed_start_is_tried_again_and_reset_starts_afresh() -> None:
    outcomes: list[Exception | None] = [RuntimeError("cluster down"), None, None]

    async def start() -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    once = StartOnce(start)
    with pytest.raises(RuntimeError, match="cluster down"):
        await once()
    await once()
    assert len(outcomes) == 1
    once.reset()
    await once()
    assert outcomes == []


async def test_a_cancelled_caller_leaves_the_start_running_for_the_others() -> None:
    gate = asyncio.Event()
    runs: list[str] = []

    async def start() -> None:
        runs.append("started")
        await gate.wait()
        runs.append("finished")

    once = StartOnce(start)
    first = asyncio.create_task(once())
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    gate.set()
    async with asyncio.timeout(5):
        await once()
    assert runs == ["started", "finished"]  # one start, not cancelled with its first caller
