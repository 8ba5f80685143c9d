"""Options shared by several commands, defined once."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

__all__ = ["OsmosisTyper", "set_option", "upstream_timeout_option"]


class _FlagsAsFlags:
    """Help that shows a flag as a flag: no ``<bool>`` after ``--fresh`` or ``--help``."""

    def get_params(self, ctx: Any) -> list[Any]:
        params: list[Any] = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


class _Command(_FlagsAsFlags, TyperCommand):
    pass


class _Group(_FlagsAsFlags, TyperGroup):
    pass


class OsmosisTyper(typer.Typer):
    """``typer.Typer`` whose groups and commands show flags as flags in ``--help``."""

    def __init__(self, **options: Any) -> None:
        super().__init__(cls=_Group, **options)

    def command(self, *args: Any, **options: Any) -> Callable[[Any], Any]:
        options.setdefault("cls", _Command)
        return super().command(*args, **options)


def set_option() -> Any:
    """``--set section.key=value`` (repeatable): a config value instead of the file's."""
    return typer.Option(
        None,
        "--set",
        metavar="SECTION.KEY=VALUE",
        show_default=False,
        help=(
            "Use this config value instead of the file's (repeatable), e.g. --set "
            "training.steps=3; checked like the file."
        ),
    )


def _positive_seconds(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"must be positive seconds, got {value}")
    return value


def upstream_timeout_option() -> Any:
    """``--upstream-timeout SECONDS``: how long one call to the policy's upstream may take."""
    return typer.Option(
        None,
        "--upstream-timeout",
        callback=_positive_seconds,
        show_default=False,
        help="Seconds one call to an openai/litellm policy may take (default 600).",
    )
