"""``StartOnce``: a backend's lazy ``start()``, shared by concurrent callers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["StartOnce"]


class StartOnce:
    """Runs ``start`` once: concurrent callers await the same run, a failed run is tried
    again by the next caller, and `reset` (at shutdown) makes the next call start afresh.

    A caller that is cancelled while waiting leaves the start running for the others.
    """

    def __init__(self, start: Callable[[], Awaitable[None]]) -> None:
        self._start = start
        self._future: asyncio.Future[None] | None = None

    async def __call__(self) -> None:
        future = self._future
        if future is None or (
            future.done() and (future.cancelled() or future.exception() is not None)
        ):
            future = self._future = asyncio.ensure_future(self._start())
        await asyncio.shield(future)

    def reset(self) -> None:
        """Forget the last start (the backend released what it acquired)."""
        self._future = None
