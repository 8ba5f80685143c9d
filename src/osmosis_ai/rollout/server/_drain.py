"""Shutting down without losing results: stop admission, finish or cancel, deliver, exit.

uvicorn closes its listening sockets before the app's lifespan ends, so a drain that only
ran there could not deliver results to pollers. When the server runs in the main thread, the
drain hooks SIGTERM/SIGINT instead: admission stops (503), in-flight rollouts get
``drain_timeout_sec`` to finish, the rest are cancelled (and report ``cancelled``), pollers
get a few seconds to collect the final results, and only then is the server's own signal
handler called to exit. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from osmosis_ai.rollout.server._state import ServerState

__all__ = ["Drainer"]

logger = logging.getLogger(__name__)

_HANDLED = (signal.SIGTERM, signal.SIGINT)
_DELIVERY_GRACE_SEC = 5.0
_CANCEL_GRACE_SEC = 10.0
_POLL_SEC = 0.05

Handler = Callable[[int, FrameType | None], Any]


class Drainer:
    """Drains one server's rollouts, once."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self._previous: dict[int, Any] = {}
        self._task: asyncio.Task[None] | None = None

    def install(self) -> None:
        """Hook SIGTERM/SIGINT (main thread only), keeping the current handlers to call later."""
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for signum in _HANDLED:
            previous = signal.getsignal(signum)
            if not callable(previous):
                continue
            self._previous[signum] = previous

            def on_signal(received: int, frame: FrameType | None) -> None:
                loop.call_soon_threadsafe(self._on_signal, received, frame)

            signal.signal(signum, on_signal)

    def uninstall(self) -> None:
        """Give the signals back to their previous handlers."""
        for signum, previous in self._previous.items():
            with contextlib.suppress(ValueError):
                signal.signal(signum, previous)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        previous: Handler = self._previous[signum]
        if self._task is not None:
            previous(signum, frame)  # second signal: leave now
            return
        logger.info("shutdown requested: draining rollouts before exiting")

        async def drain_then_exit() -> None:
            try:
                await self.drain(deliver=True)
            finally:
                previous(signum, frame)

        self._task = asyncio.get_running_loop().create_task(drain_then_exit())

    async def drain(self, *, deliver: bool) -> None:
        """Stop admission, let rollouts finish within the bound, cancel the rest.

        With ``deliver``, also wait (briefly) until pollers have collected final results.
        Safe to call again: later calls only wait for what is left.
        """
        state = self.state
        state.accepting = False
        if state.tasks:
            logger.info(
                "waiting up to %gs for %d rollout(s)", state.drain_timeout_sec, len(state.tasks)
            )
            await _until(lambda: not state.tasks, state.drain_timeout_sec)
        running = [task for task in state.tasks if not task.done()]
        if running:
            logger.warning("cancelling %d rollout(s) still running", len(running))
            state.draining = True
            for task in running:
                task.cancel()
            await asyncio.wait(running, timeout=_CANCEL_GRACE_SEC)
        if deliver:
            await _until(lambda: state.registry.undelivered() == 0, _DELIVERY_GRACE_SEC)


async def _until(condition: Callable[[], bool], bound_sec: float) -> None:
    deadline = time.monotonic() + bound_sec
    while not condition() and time.monotonic() < deadline:  # noqa: ASYNC110 -- several sources
        await asyncio.sleep(_POLL_SEC)
