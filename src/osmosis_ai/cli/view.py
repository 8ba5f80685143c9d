"""``osmosis view``: browse eval runs, trajectories and live previews in a local web page."""

from __future__ import annotations

import contextlib
from pathlib import Path

import typer

from osmosis_ai.cli._asyncio import run, wait_for_stop_signal

__all__ = ["view_command"]

_DEFAULT_ROOT = Path(".osmosis") / "evals"


def view_command(
    path: Path | None = typer.Argument(
        None,
        help="A run directory, or a folder of them (default: ./.osmosis/evals).",
        show_default=False,
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to bind (local only by default)."
    ),
    port: int = typer.Option(0, "--port", help="Port to bind; 0 picks a free one."),
) -> None:
    """Serve the run viewer until interrupted, printing its address."""
    root = path if path is not None else _DEFAULT_ROOT
    if not root.is_dir():
        raise typer.BadParameter(
            f"{root} is not a directory; pass a run directory or the folder holding runs "
            "(osmosis eval run writes them under <workspace>/.osmosis/evals)",
            param_hint="PATH",
        )
    with contextlib.suppress(KeyboardInterrupt):
        run(_serve(root.resolve(), host, port))


async def _serve(root: Path, host: str, port: int) -> None:
    from osmosis_ai.viewer import Viewer

    async with Viewer(root, host=host, port=port) as viewer:
        await wait_for_stop_signal(on_ready=lambda: typer.echo(f"viewer: {viewer.url}  ({root})"))
