"""ConcurrencyLimiter keeps exact counters under cancellation."""

from __future__ import annotations

import asyncio

from osmosis_ai.rollout.backend._limiter import ConcurrencyLimiter


async def test_uncapped_limiter_never_waits() -> None:
    limiter = ConcurrencyLimiter(None)
    for _ in range(100):
        await limiter.acquire()
    assert limiter.has_free_slot()
    assert limiter.snapshot() == {"max_concurrent": None, "queued": 0, "running": 100}


async def test_capped_limiter_queues_and_counts_exactly() -> None:
    limiter = ConcurrencyLimiter(1)
    await limiter.acquire()
    assert not limiter.has_free_slot()
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    assert limiter.snapshot() == {"max_concurrent": 1, "queued": 1, "running": 1}
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert limiter.snapshot() == {"max_concurrent": 1, "queued": 0, "running": 1}
    limiter.release()
    assert limiter.has_free_slot()
    await asyncio.wait_for(limiter.acquire(), 1)
    assert limiter.snapshot()["running"] == 1
