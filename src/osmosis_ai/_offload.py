"""Short blocking file operations run off the event loop, for the rollout hot path.

`asyncio.to_thread` costs, per call, a `concurrent.futures.Future` with its lock, a chain of
callbacks and one wake-up of the event loop (a write to its self-pipe). A rollout server
makes three such calls per rollout (creating and removing the artifacts directory, saving
the trajectory): a fifth of a no-op rollout's CPU. Here a few process-wide threads take jobs
from one queue, and the results owed to a loop go back in batches: the results that
complete while the loop is busy share one wake-up.

Like `asyncio.to_thread`: a cancelled caller stops waiting but its job still runs, and
interpreter exit waits (up to `EXIT_WAIT_SEC`) for the jobs already taken. Unlike it, the
function runs without the caller's context variables.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

__all__ = ["EXIT_WAIT_SEC", "WORKERS", "run_blocking"]

P = ParamSpec("P")
T = TypeVar("T")

WORKERS = 4
#: Longest interpreter exit waits for unfinished jobs (a file write on a hung network mount
#: must not keep a stopped server alive for ever).
EXIT_WAIT_SEC = 30.0

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[], Any]]
_Outcome = tuple["asyncio.Future[Any]", bool, Any]


class _Offloader:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.workers = 0
        self.unfinished = 0
        # Results not yet handed to their loop; a loop appears here only while it is owed.
        self.owed: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}

    def submit(self, loop: asyncio.AbstractEventLoop, call: Callable[[], T]) -> asyncio.Future[T]:
        future: asyncio.Future[T] = loop.create_future()
        with self.lock:
            self.unfinished += 1
            start = self.workers < WORKERS
            if start:
                self.workers += 1
        if start:
            threading.Thread(target=self._work, name="osmosis-file-io", daemon=True).start()
        self.jobs.put((loop, future, call))
        return future

    def _work(self) -> None:
        while True:
            loop, future, call = self.jobs.get()
            try:
                outcome: _Outcome = (future, True, call())
            except BaseException as exc:  # handed to the caller, as asyncio.to_thread does
                outcome = (future, False, exc)
            with self.lock:
                owed = self.owed.get(loop)
                if owed is None:
                    self.owed[loop] = [outcome]
                else:
                    owed.append(outcome)
            if owed is None:
                try:
                    loop.call_soon_threadsafe(self._deliver, loop)
                except RuntimeError:  # the loop is closed: nobody waits for these
                    with self.lock:
                        self.owed.pop(loop, None)
            with self.lock:
                self.unfinished -= 1
                if not self.unfinished:
                    self.idle.notify_all()

    def _deliver(self, loop: asyncio.AbstractEventLoop) -> None:
        with self.lock:
            outcomes = self.owed.pop(loop, [])
        for future, ok, value in outcomes:
            if future.done():  # the caller was cancelled
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def wait_idle(self, timeout: float) -> None:
        with self.lock:
            self.idle.wait_for(lambda: not self.unfinished, timeout)


_offloader = _Offloader()


def _reset_after_fork() -> None:
    # The child has none of the parent's threads: start afresh.
    global _offloader
    _offloader = _Offloader()


os.register_at_fork(after_in_child=_reset_after_fork)
atexit.register(lambda: _offloader.wait_idle(EXIT_WAIT_SEC))


async def run_blocking(func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``func(*args, **kwargs)`` on one of a few shared worker threads; its result or error.

    For short blocking file operations on hot paths; anything that may block for long
    belongs in `asyncio.to_thread` (it would hold one of only `WORKERS` threads).
    """
    loop = asyncio.get_running_loop()
    return await _offloader.submit(loop, lambda: func(*args, **kwargs))
