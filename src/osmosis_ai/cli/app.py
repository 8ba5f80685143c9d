"""The root ``osmosis`` typer application."""

from __future__ import annotations

import typer

from osmosis_ai import __version__
from osmosis_ai.cli._logging import quiet_logging_errors
from osmosis_ai.cli._options import OsmosisTyper
from osmosis_ai.cli.eval import eval_app
from osmosis_ai.cli.gateway import gateway_command
from osmosis_ai.cli.rollout import rollout_app
from osmosis_ai.cli.train import train_app
from osmosis_ai.cli.view import view_command

__all__ = ["app", "main"]

app = OsmosisTyper(
    name="osmosis",
    help="Run AgentWorkflow rollouts: local evaluation, rollout servers and tools around them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"osmosis-ai {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the installed osmosis-ai version and exit.",
    ),
) -> None:
    """Run AgentWorkflow rollouts: local evaluation, rollout servers and tools around them."""
    quiet_logging_errors()


app.command("gateway")(gateway_command)
app.command("view")(view_command)
app.add_typer(eval_app, name="eval")
app.add_typer(rollout_app, name="rollout")
app.add_typer(train_app, name="train")


def main() -> None:
    """Console-script entry point."""
    app()
