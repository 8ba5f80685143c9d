"""``osmosis view``: browse eval and training runs, trajectories and live previews in a web page."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from osmosis_ai.cli._asyncio import run, wait_for_stop_signal
from osmosis_ai.cli._output import bind_failure, error_exit

if TYPE_CHECKING:
    from osmosis_ai.viewer import Viewer

__all__ = ["view_command"]

# A workspace's runs: eval runs in evals/, training runs in train/.
_DEFAULT_ROOT = Path(".osmosis")


def view_command(
    path: Path | None = typer.Argument(
        None,
        help="A run directory, a folder of them, or a workspace's .osmosis (the default).",
        show_default=False,
    ),
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Address to bind (local only by default; any other address requires a token).",
    ),
    port: int = typer.Option(
        0, "--port", min=0, max=65535, help="Port to bind; 0 picks a free one."
    ),
    token: str | None = typer.Option(
        None,
        "--token",
        envvar="OSMOSIS_VIEWER_TOKEN",
        help="Token every request must show; random off 127.0.0.1 when omitted.",
    ),
) -> None:
    """Serve the run viewer until interrupted, printing its address."""
    from osmosis_ai.errors import ConfigError
    from osmosis_ai.viewer import Viewer

    root = path if path is not None else _DEFAULT_ROOT
    if not root.is_dir():
        raise typer.BadParameter(
            f"{root} is not a directory; pass a run directory or the folder holding runs "
            "(osmosis eval run and osmosis train run write them under <workspace>/.osmosis)",
            param_hint="PATH",
        )
    try:
        viewer = Viewer(root.resolve(), host=host, port=port, token=token)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--token") from exc
    with contextlib.suppress(KeyboardInterrupt):
        run(_serve(viewer, root.resolve()))


async def _serve(viewer: Viewer, root: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        try:
            await stack.enter_async_context(viewer)
        except OSError as exc:
            raise error_exit(bind_failure(viewer.host, viewer.port, exc)) from None

        def announce() -> None:
            typer.echo(f"viewer: {viewer.url}  ({root})")  # the only place the token is shown
            if viewer.token is not None:
                typer.echo(
                    "viewer: every request needs the token in that link; a browser that "
                    "opened it once keeps it in a cookie for this viewer"
                )

        await wait_for_stop_signal(on_ready=announce)
