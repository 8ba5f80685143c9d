"""Options shared by several commands, defined once."""

from __future__ import annotations

import math
from typing import Any

import typer

__all__ = ["upstream_timeout_option"]


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
