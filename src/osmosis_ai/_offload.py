"""Short blocking file operations run off the event loop, for the rollout hot path.

`asyncio.to_thread` costs, per call, a `concurrent.futures.Future` with its lock, a chain of
callbacks and one wake-up of the event loop (a write to its self-pipe). A rollout server
makes three such calls per rollout (creating and removing the artifacts directory, saving
the trajectory): about a tenth of a no-op rollout's CPU. Here a few process-wide threads
take jobs from one queue, and the results owed to a loop go back in batches: the results
that complete while the loop is busy share one wake-up.

Like `asyncio.to_thread`: a cancelled caller stops waiting but its job still runs, and
interpreter exit waits (up to `EXIT_WAIT_SEC`) for the jobs already taken. Unlike it, the
function runs without the caller's context variables.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

__all__ = ["EXIT_WAIT_SEC", "WORKERS", "run_blocking"]

P = ParamSpec("P")
T = TypeVar("T")

WORKERS = 4
#: Longest interpreter exit waits for unfinished jobs (a file write on a hung network mount
#: must not keep a stopped server alive for ever).
EXIT_WAIT_SEC = 30.0


class _Owed:
    """The results owed to one event loop, handed over in one callback per batch."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak: this object is the loop's value in a WeakKeyDictionary.
        self.loop = weakref.ref(loop)
        self.outcomes: collections.deque[_Outcome] = collections.deque()
        self.scheduled = False

    def add(self, outcome: _Outcome) -> None:
        """On a worker: queue ``outcome``; wake the loop unless a wake-up is pending."""
        self.outcomes.append(outcome)
        # Appended before the flag is read, and the loop clears the flag before it drains:
        # an outcome is always drained by a pending wake-up or by the one scheduled here.
        if not self.scheduled:
            self.scheduled = True
            loop = self.loop()
            try:
                if loop is None:
                    raise RuntimeError("the event loop is gone")
                loop.call_soon_threadsafe(self.deliver)
            except RuntimeError:  # the loop is closed: nobody waits for these
                self.outcomes.clear()

    def deliver(self) -> None:
        """On the loop: settle every future owed so far."""
        self.scheduled = False
        outcomes = self.outcomes
        while outcomes:
            future, ok, value = outcomes.popleft()
            if future.done():  # the caller was cancelled
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)


_Outcome = tuple["asyncio.Future[Any]", bool, Any]
_Job = tuple[_Owed, "asyncio.Future[Any]", Callable[[], Any]]


class _Offloader:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.workers: list[threading.Thread] = []
        self.owed: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Owed] = (
            weakref.WeakKeyDictionary()
        )

    def submit(self, loop: asyncio.AbstractEventLoop, call: Callable[[], T]) -> asyncio.Future[T]:
        owed = self.owed.get(loop)
        if owed is None:
            owed = self.owed[loop] = _Owed(loop)
        if len(self.workers) < WORKERS:
            worker = threading.Thread(target=self._work, name="osmosis-file-io", daemon=True)
            self.workers.append(worker)
            worker.start()
        future: asyncio.Future[T] = loop.create_future()
        self.jobs.put((owed, future, call))
        return future

    def _work(self) -> None:
        # One call per job: nothing of a finished job (its future holds its loop) stays
        # referenced while the worker waits for the next.
        while self._run(self.jobs.get()):
            pass

    @staticmethod
    def _run(job: _Job | None) -> bool:
        if job is None:
            return False
        owed, future, call = job
        try:
            owed.add((future, True, call()))
        except BaseException as exc:  # handed to the caller, as asyncio.to_thread does
            owed.add((future, False, exc))
        return True

    def stop(self, timeout: float) -> None:
        """Let the workers finish the jobs already queued (within ``timeout``), then end."""
        deadline = time.monotonic() + timeout
        for _ in self.workers:
            self.jobs.put(None)
        for worker in self.workers:
            worker.join(max(0.0, deadline - time.monotonic()))


_offloader = _Offloader()


def _reset_after_fork() -> None:
    # The child has none of the parent's threads: start afresh.
    global _offloader
    _offloader = _Offloader()


os.register_at_fork(after_in_child=_reset_after_fork)
atexit.register(lambda: _offloader.stop(EXIT_WAIT_SEC))


async def run_blocking(func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``func(*args, **kwargs)`` on one of a few shared worker threads; its result or error.

    For short blocking file operations on hot paths; anything that may block for long
    belongs in `asyncio.to_thread` (it would hold one of only `WORKERS` threads).
    """
    loop = asyncio.get_running_loop()
    return await _offloader.submit(loop, lambda: func(*args, **kwargs))
