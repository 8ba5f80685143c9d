"""``--view`` of the run commands: the viewer on the run while it goes, then until Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import quote

from osmosis_ai.cli._asyncio import wait_for_stop_signal

if TYPE_CHECKING:
    from rich.console import Console

    from osmosis_ai.train.loop.runner import TrainHooks, TrainOptions, TrainOutcome

__all__ = ["keep_viewing", "open_viewer", "watch_training"]

T = TypeVar("T")


async def open_viewer(
    stack: contextlib.AsyncExitStack, root: Path, page: str, console: Console
) -> None:
    """Serve the viewer of ``root`` (on 127.0.0.1) in ``stack``; print the address of
    ``page`` (a route of the page, e.g. ``/run/<name>``)."""
    from osmosis_ai.viewer import Viewer

    viewer = await stack.enter_async_context(Viewer(root))
    console.print(f"viewer: {viewer.url}#{page}")


async def keep_viewing(console: Console) -> None:
    """Keep serving after the run ended, until Ctrl-C."""
    await wait_for_stop_signal(on_ready=lambda: console.print("the viewer stays up until Ctrl-C"))


async def _viewed(
    work: Callable[[], Awaitable[T]],
    root: Path,
    page: str,
    console: Console,
    report: Callable[[T], None],
) -> T:
    async with contextlib.AsyncExitStack() as stack:
        await open_viewer(stack, root, page, console)
        outcome = await work()
        report(outcome)
        await keep_viewing(console)
        return outcome


async def watch_training(
    options: TrainOptions,
    hooks: TrainHooks,
    console: Console,
    report: Callable[[TrainOutcome], None],
) -> TrainOutcome:
    """``osmosis train run --view``: train with the viewer on the workspace's runs, its
    address on the run's page; ``report`` the outcome, then serve until Ctrl-C.

    Raises:
        ConfigError, TrainingStopped: As `run_training`.
    """
    from osmosis_ai.train.config import load_train_config
    from osmosis_ai.train.loop.runner import run_training

    config = await asyncio.to_thread(load_train_config, options.config_path, options.overrides)
    # The runner's run name: --name, else the config's file name.
    name = options.name or options.config_path.stem
    page = f"/train/{quote(name)}"
    root = config.workspace / ".osmosis"
    return await _viewed(lambda: run_training(options, hooks), root, page, console, report)
