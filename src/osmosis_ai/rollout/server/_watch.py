"""Watching the event loop: its lag, and which rollout blocked it."""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import logging
import time
from collections.abc import Coroutine, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["BlockReport", "LoopMonitor", "tracked"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class BlockReport:
    """One step of a rollout that held the event loop too long."""

    rollout_id: str
    seconds: float
    at: float
    """Wall-clock time (epoch seconds) the step ended."""


class LoopMonitor:
    """Measures event-loop lag with a periodic timer, and records blocking rollout steps.

    Every step of a rollout's task runs through `tracked`, which times it; a step longer
    than ``block_threshold_sec`` is logged with the rollout id (nothing else can run during
    it, so the lag is that rollout's doing). The timer measures the lag everyone sees.
    """

    def __init__(self, *, interval_sec: float = 0.25, block_threshold_sec: float = 0.5) -> None:
        self.interval_sec = interval_sec
        self.block_threshold_sec = block_threshold_sec
        self.lag_sec = 0.0
        self.max_lag_sec = 0.0
        self.last_block: BlockReport | None = None
        self.blocks = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the lag timer on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._measure())

    async def stop(self) -> None:
        """Stop the lag timer."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _measure(self) -> None:
        while True:
            expected = time.perf_counter() + self.interval_sec
            await asyncio.sleep(self.interval_sec)
            self.lag_sec = max(0.0, time.perf_counter() - expected)
            self.max_lag_sec = max(self.max_lag_sec, self.lag_sec)

    def report_block(self, rollout_id: str, seconds: float) -> None:
        """Record (and log) a step of ``rollout_id`` that ran ``seconds`` without yielding."""
        self.blocks += 1
        self.last_block = BlockReport(rollout_id, seconds, time.time())
        logger.warning(
            "rollout %s blocked the event loop for %.2fs; run blocking work with "
            "asyncio.to_thread so other rollouts, polls and health checks keep running",
            rollout_id,
            seconds,
        )

    def health(self) -> dict[str, Any]:
        """Lag figures for ``/health``."""
        block = self.last_block
        return {
            "lag_ms": round(self.lag_sec * 1000, 1),
            "max_lag_ms": round(self.max_lag_sec * 1000, 1),
            "blocking_steps": self.blocks,
            "last_block": (
                None
                if block is None
                else {
                    "rollout_id": block.rollout_id,
                    "seconds": round(block.seconds, 3),
                    "at": block.at,
                }
            ),
        }


class _Tracked(collections.abc.Coroutine[Any, Any, T]):
    """A coroutine that times each step of the one it wraps."""

    __slots__ = ("_coro", "_monitor", "_rollout_id")

    def __init__(self, coro: Coroutine[Any, Any, T], monitor: LoopMonitor, rollout_id: str) -> None:
        self._coro = coro
        self._monitor = monitor
        self._rollout_id = rollout_id

    def _timed(self, step: Any, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return step(*args)
        finally:
            elapsed = time.perf_counter() - started
            if elapsed > self._monitor.block_threshold_sec:
                self._monitor.report_block(self._rollout_id, elapsed)

    def send(self, value: Any) -> Any:
        return self._timed(self._coro.send, value)

    def throw(self, *args: Any) -> Any:
        return self._timed(self._coro.throw, *args)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, T]:
        return self

    def __iter__(self) -> _Tracked[T]:
        return self

    def __next__(self) -> Any:
        return self.send(None)


def tracked(
    coro: Coroutine[Any, Any, T], monitor: LoopMonitor, rollout_id: str
) -> Coroutine[Any, Any, T]:
    """``coro`` with each of its steps timed against ``monitor``'s block threshold."""
    return _Tracked(coro, monitor, rollout_id)
