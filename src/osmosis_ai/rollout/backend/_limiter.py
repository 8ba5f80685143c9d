"""A concurrency cap with exact queued/running counters."""

from __future__ import annotations

import asyncio

__all__ = ["ConcurrencyLimiter"]


class ConcurrencyLimiter:
    """Caps simultaneous executions; ``max_concurrent=None`` means no cap.

    Counters stay exact when a waiter is cancelled or the holder raises, because every
    change happens in ``acquire``/``release`` around the semaphore.
    """

    def __init__(self, max_concurrent: int | None) -> None:
        self.max_concurrent = max_concurrent
        self._semaphore = asyncio.Semaphore(max_concurrent) if max_concurrent else None
        self.queued = 0
        self.running = 0

    def has_free_slot(self) -> bool:
        """Whether a new execution would start without waiting."""
        if self.max_concurrent is None:
            return True
        return self.running + self.queued < self.max_concurrent

    async def acquire(self) -> None:
        """Wait for a slot; on cancellation nothing is held."""
        if self._semaphore is not None:
            self.queued += 1
            try:
                await self._semaphore.acquire()
            finally:
                self.queued -= 1
        self.running += 1

    def release(self) -> None:
        """Give the slot back."""
        self.running -= 1
        if self._semaphore is not None:
            self._semaphore.release()

    def snapshot(self) -> dict[str, int | None]:
        """``{"max_concurrent", "queued", "running"}`` for health payloads."""
        return {
            "max_concurrent": self.max_concurrent,
            "queued": self.queued,
            "running": self.running,
        }
