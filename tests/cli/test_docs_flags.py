"""docs/eval.md's table of `osmosis eval run`'s flags lists each of the command's options,
and nothing else: an option added to the CLI without its row fails here."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from osmosis_ai.cli.app import app

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _documented(page: Path, heading: str) -> set[str]:
    """The option names in the first column of the table under ``heading``."""
    text = page.read_text()
    section = text[text.index(heading) :]
    rows = re.findall(r"^\| (`-.*?) \|", section.split("\n\n| code |")[0], flags=re.M)
    return {name for row in rows for name in re.findall(r"`(--?[a-z][a-z-]*)", row)}


def test_the_eval_flags_table_lists_every_option_of_the_command() -> None:
    group = typer.main.get_command(app)
    command = group.commands["eval"].commands["run"]  # type: ignore[attr-defined]
    options = {
        name
        for param in command.params
        if param.param_type_name == "option"
        for name in (*param.opts, *param.secondary_opts)
    } - {"--help"}
    assert _documented(DOCS / "eval.md", "## Flags") == options
