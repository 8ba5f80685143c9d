"""``osmosis rollout init`` and ``osmosis rollout validate``."""

from __future__ import annotations

from pathlib import Path

import typer

from osmosis_ai.cli._options import OsmosisTyper
from osmosis_ai.cli._output import error_exit

__all__ = ["rollout_app"]

rollout_app = OsmosisTyper(help="Create and check rollouts.", no_args_is_help=True)


@rollout_app.command("init")
def init_command(
    name: str = typer.Argument(..., help="Rollout name (rollouts/<name>/)."),
    workspace: Path = typer.Option(Path("."), "--workspace", help="Workspace root."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing scaffold files."),
) -> None:
    """Scaffold a runnable rollout, its eval and training configs and a 10-row dataset."""
    from osmosis_ai.errors import OsmosisError
    from osmosis_ai.scaffold import scaffold_rollout

    try:
        written = scaffold_rollout(workspace, name, force=force)
    except OsmosisError as exc:
        raise error_exit(str(exc)) from None
    for path in written:
        typer.echo(f"wrote {path}")
    configs = workspace / "configs"
    typer.echo(f"next: osmosis eval run {configs / 'eval' / (name + '.toml')}")
    typer.echo(f"then: osmosis train run {configs / 'training' / (name + '.toml')}")


@rollout_app.command("validate")
def validate_command(
    rollout_dir: Path = typer.Argument(..., help="The rollout directory (rollouts/<name>)."),
    entrypoint: str = typer.Option("main.py", "--entrypoint", help="Entry point file."),
) -> None:
    """Start the entry point once as `osmosis eval run` would; report why it does not serve."""
    from osmosis_ai.scaffold import validate_entrypoint

    ok, problem = validate_entrypoint(rollout_dir, entrypoint)
    if not ok:
        typer.echo(problem, err=True)
        typer.echo(f"invalid: {rollout_dir / entrypoint} does not serve a rollout server", err=True)
        raise typer.Exit(1)
    typer.echo(f"ok: {rollout_dir / entrypoint} starts and answers /health")
