"""Write the config key tables of the docs from the keys' declarations.

``python scripts/config_tables.py`` rewrites, in ``docs/eval.md``, ``docs/train/``,
``docs/environments.md`` and ``docs/judges.md``, each
table between ``<!-- config-table: NAME -->`` and ``<!-- /config-table -->`` as the settings'
declarations (`osmosis_ai.config.schema.setting`) have it; the rest of the files is left as it
is.
``--check`` writes nothing and exits 1 when a table differs (the test suite runs it), so a key
added to the declarations cannot be missing from the docs.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from osmosis_ai.config.judge import JUDGE
from osmosis_ai.config.schema import markdown_table
from osmosis_ai.environments import ENVIRONMENT
from osmosis_ai.eval.config import EVAL_EXPERIMENT, EVALUATION
from osmosis_ai.train.config import TRAIN_EXPERIMENT, TRAIN_SECTIONS
from osmosis_ai.train.recipes import RECIPE_PAPERS, RECIPES, recipe_summary

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = (
    DOCS / "eval.md",
    DOCS / "train" / "reference.md",
    DOCS / "train" / "recipes.md",
    DOCS / "environments.md",
    DOCS / "judges.md",
)


def recipe_table() -> str:
    """The named recipes: each one's paper and the keys it sets apart from the defaults."""
    lines = ["| `recipe` | paper | sets |", "|---|---|---|"]
    for name in RECIPES:
        lines.append(f"| `{name}` | {RECIPE_PAPERS[name]} | `{recipe_summary(name)}` |")
    return "\n".join(lines) + "\n"


TABLES: dict[str, Callable[[], str]] = {
    "eval": lambda: markdown_table(EVAL_EXPERIMENT, EVALUATION),
    "training": lambda: markdown_table(TRAIN_EXPERIMENT, *TRAIN_SECTIONS),
    "recipes": recipe_table,
    "environment": lambda: markdown_table(ENVIRONMENT),
    "judge": lambda: markdown_table(JUDGE),
}
_TABLE = re.compile(r"(<!-- config-table: (\w+) -->\n).*?(<!-- /config-table -->)", re.DOTALL)


def with_tables(text: str) -> str:
    """``text`` with every marked table replaced by the one its name declares."""
    return _TABLE.sub(lambda m: m[1] + TABLES[m[2]]() + m[3], text)


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print("usage: python scripts/config_tables.py [--check]", file=sys.stderr)
        return 2
    stale: list[Path] = []
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        if not _TABLE.search(text):
            print(f"{path}: no <!-- config-table: NAME --> marker", file=sys.stderr)
            return 1
        if (tables := with_tables(text)) != text:
            stale.append(path)
            if not argv:
                path.write_text(tables, encoding="utf-8")
                print(f"rewrote the config table of {path}")
    if argv and stale:
        print(
            ", ".join(map(str, stale)) + ": the config tables differ from the declarations in "
            "the config dataclasses; run python scripts/config_tables.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
