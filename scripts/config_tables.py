"""Write the config key tables of the docs from the keys' declarations.

``python scripts/config_tables.py`` rewrites, in ``docs/eval.md`` and ``docs/train.md``, each
table between ``<!-- config-table: NAME -->`` and ``<!-- /config-table -->`` as
`osmosis_ai.eval._config_schema` declares it; the rest of the files is left as it is.
``--check`` writes nothing and exits 1 when a table differs (the test suite runs it), so a key
added to the declarations cannot be missing from the docs.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from osmosis_ai.eval._config_schema import (
    EVAL_EXPERIMENT,
    EVALUATION,
    TRAIN_EXPERIMENT,
    TRAINING,
    VLLM,
    Section,
    markdown_table,
)

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = (DOCS / "eval.md", DOCS / "train.md")
TABLES: dict[str, tuple[Section, ...]] = {
    "eval": (EVAL_EXPERIMENT, EVALUATION),
    "training": (TRAIN_EXPERIMENT, TRAINING, VLLM),
}
_TABLE = re.compile(r"(<!-- config-table: (\w+) -->\n).*?(<!-- /config-table -->)", re.DOTALL)


def with_tables(text: str) -> str:
    """``text`` with every marked table replaced by the one its name declares."""
    return _TABLE.sub(lambda m: m[1] + markdown_table(*TABLES[m[2]]) + m[3], text)


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
            "osmosis_ai/eval/_config_schema.py; run python scripts/config_tables.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
