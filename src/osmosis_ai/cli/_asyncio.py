"""Running a CLI command's coroutine, on uvloop when it is installed."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["run", "wait_for_stop_signal"]

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, with uvloop's faster event loop when available."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


async def wait_for_stop_signal(on_ready: Callable[[], None] | None = None) -> None:
    """Return on the first SIGINT or SIGTERM (a server command's "until interrupted").

    ``on_ready`` runs once the handlers are in place: whatever it announces ("press
    Ctrl-C to stop") cannot be answered by a signal that arrives too early.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        if on_ready is not None:
            on_ready()
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
