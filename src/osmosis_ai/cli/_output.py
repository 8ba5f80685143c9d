"""Terminal output of the CLI: user and config text is printed as given, never as markup.

Messages quote config sections (``[experiment]``), paths and server output; rich would read
their brackets as style tags, dropping them or failing with ``MarkupError``.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import sys
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["bind_failure", "error_exit", "plain_console", "silence_tqdm"]


def plain_console(*, stderr: bool = False) -> Console:
    """A rich console that never interprets markup and never wraps a line."""
    from rich.console import Console

    return Console(stderr=stderr, markup=False, soft_wrap=True)


def silence_tqdm() -> None:
    """Turn off every tqdm progress bar of this process (libraries' "Loading weights"...).

    tqdm reads ``TQDM_*`` overrides from the environment once, when it is imported: import it
    with ``TQDM_DISABLE`` set, then restore the environment so child processes (the user's
    rollout server) keep their own bars. A no-op when tqdm is missing or already imported.
    """
    if "tqdm" in sys.modules:
        return
    previous = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    try:
        with contextlib.suppress(ImportError):
            importlib.import_module("tqdm")
    finally:
        if previous is None:
            del os.environ["TQDM_DISABLE"]
        else:
            os.environ["TQDM_DISABLE"] = previous


def bind_failure(host: str, port: int, exc: OSError) -> str:
    """One line for a socket that cannot be bound (the port taken, the address not ours)."""
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is in use; pick another --port, or 0 for a free one"
    reason = exc.strerror or str(exc)
    return f"cannot listen on {host} port {port} ({reason}); check --host and --port"


def error_exit(message: str, *, code: int = 2) -> typer.Exit:
    """Print ``error: <message>`` on stderr and return the exit to raise.

    Usage: ``raise error_exit(str(exc)) from None``; code 2 is a usage or config error.
    """
    from rich.text import Text

    plain_console(stderr=True).print(Text.assemble(("error:", "bold red"), " ", message))
    return typer.Exit(code)
