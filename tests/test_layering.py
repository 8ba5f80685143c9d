"""Layering (import-linter style): dependencies point one way, checked on every module's source.

``cli → (train → eval) → (client, gateway) → rollout core``: nothing in ``rollout/`` imports
the controller side, nothing but the CLI itself imports ``cli/`` (the console entry point
names ``osmosis_ai.cli:main`` without importing it), the contract module ``rollout/types.py``
does not import a backend, and no module reaches into another package's private parts (a
``_name`` module, or a ``_name`` of a module, is its package's own: what is shared has a
public name). Imports are read with ``ast``, so imports inside functions (the lazy ones)
count too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


@dataclass(frozen=True)
class Rule:
    """Modules under ``importers`` (except ``exempt``) must not import ``forbidden``."""

    importers: str
    forbidden: tuple[str, ...]
    why: str
    exempt: tuple[str, ...] = ()


CONTROLLER = tuple(f"osmosis_ai.{part}" for part in ("gateway", "eval", "train", "viewer", "cli"))
ROLLOUT_SIDE = Rule(
    "osmosis_ai.rollout", CONTROLLER, "the rollout side never imports the controller side"
)
NO_CLI = Rule(
    "osmosis_ai",
    ("osmosis_ai.cli",),
    "only the console entry point reaches the CLI",
    exempt=("osmosis_ai.cli",),
)
CONTRACT = Rule(
    "osmosis_ai.rollout.types",
    ("osmosis_ai.rollout.backend",),
    "the wire vocabulary belongs to the contract layer, below the backends",
)


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, *, is_package: bool) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every import in ``source``, relative ones resolved.

    ``from a import b`` yields ``a`` and ``a.b`` (``b`` may be a submodule);
    ``importlib.import_module("a")`` with a literal name yields ``a``.
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            yield node.lineno, target
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def violations(root: Path, rule: Rule) -> list[str]:
    """``path:line: importer imports module`` for each import under ``root`` breaking ``rule``."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(root, path)
        if not _within(module, rule.importers) or any(_within(module, e) for e in rule.exempt):
            continue
        source = path.read_text(encoding="utf-8")
        is_package = path.name == "__init__.py"
        for line, imported in imported_modules(source, module, is_package=is_package):
            if any(_within(imported, forbidden) for forbidden in rule.forbidden):
                where = path.relative_to(root).as_posix()
                found.append(f"{where}:{line}: {module} imports {imported} ({rule.why})")
    return found


def private_imports(root: Path) -> list[str]:
    """``path:line: importer imports module`` for each import of a ``_name`` (module or
    name) whose owner, the package or module it belongs to, is not the importer's package
    or one above it."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(root, path)
        is_package = path.name == "__init__.py"
        package = module if is_package else module.rpartition(".")[0]
        for line, imported in imported_modules(path.read_text(encoding="utf-8"), module,
                                               is_package=is_package):  # fmt: skip
            parts = imported.split(".")
            private = next(
                (i for i, part in enumerate(parts) if part.startswith("_")
                 and not part.startswith("__")), None
            )  # fmt: skip
            if private is None:
                continue
            owner = ".".join(parts[:private])
            if not _within(package, owner):
                where = path.relative_to(root).as_posix()
                found.append(f"{where}:{line}: {module} imports {'.'.join(parts[: private + 1])}")
    return sorted(set(found))


def test_no_module_imports_another_package_s_private_parts() -> None:
    assert private_imports(SRC) == []


def test_the_private_import_checker_finds_reaches_across_packages(tmp_path: Path) -> None:
    files = {
        "osmosis_ai/__init__.py": "",
        "osmosis_ai/a/__init__.py": "",
        "osmosis_ai/a/_inner.py": "x = 1\n",
        "osmosis_ai/a/mine.py": "from osmosis_ai.a._inner import x\nfrom ._inner import x\n",
        "osmosis_ai/a/sub/__init__.py": "",
        "osmosis_ai/a/sub/deep.py": "from osmosis_ai.a._inner import x\n",  # below its owner
        "osmosis_ai/b/__init__.py": "",
        "osmosis_ai/b/other.py": "from osmosis_ai.a._inner import x\n",
        "osmosis_ai/b/name.py": "def f():\n    from osmosis_ai.a.mine import _hidden\n",
        "osmosis_ai/b/dunder.py": "from osmosis_ai.a import __version__\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert private_imports(tmp_path) == [
        "osmosis_ai/b/name.py:2: osmosis_ai.b.name imports osmosis_ai.a.mine._hidden",
        "osmosis_ai/b/other.py:1: osmosis_ai.b.other imports osmosis_ai.a._inner",
    ]


def test_rollout_side_imports_no_controller_module() -> None:
    assert violations(SRC, ROLLOUT_SIDE) == []


def test_nothing_but_the_cli_imports_the_cli() -> None:
    assert violations(SRC, NO_CLI) == []


def test_contract_module_does_not_import_backends() -> None:
    assert violations(SRC, CONTRACT) == []


def test_checker_finds_every_kind_of_bad_import(tmp_path: Path) -> None:
    files = {
        "osmosis_ai/__init__.py": "",
        "osmosis_ai/rollout/__init__.py": "from osmosis_ai.rollout.ok import x\n",
        "osmosis_ai/rollout/ok.py": "import osmosis_ai.errors\nfrom . import types\n",
        "osmosis_ai/rollout/top.py": "import osmosis_ai.gateway.app\n",
        "osmosis_ai/rollout/lazy.py": "def f():\n    from osmosis_ai import eval\n",
        "osmosis_ai/rollout/sub/__init__.py": "from ...viewer import serve\n",
        "osmosis_ai/rollout/sub/rel.py": "from ...cli.main import run\n",
        "osmosis_ai/rollout/dyn.py": "import importlib as il\nil.import_module('osmosis_ai.train')",
        "osmosis_ai/rollout/types.py": "from .backend.base import Outcome\n",
        "osmosis_ai/gateway/app.py": "\n\nimport osmosis_ai.cli\n",
        "osmosis_ai/cli/main.py": "from osmosis_ai.cli import commands\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)

    def bad(rule: Rule) -> list[str]:
        return [v.split(" (")[0] for v in violations(tmp_path, rule)]

    assert bad(ROLLOUT_SIDE) == [
        "osmosis_ai/rollout/dyn.py:2: osmosis_ai.rollout.dyn imports osmosis_ai.train",
        "osmosis_ai/rollout/lazy.py:2: osmosis_ai.rollout.lazy imports osmosis_ai.eval",
        "osmosis_ai/rollout/sub/__init__.py:1: osmosis_ai.rollout.sub imports osmosis_ai.viewer",
        "osmosis_ai/rollout/sub/__init__.py:1: osmosis_ai.rollout.sub imports "
        "osmosis_ai.viewer.serve",
        "osmosis_ai/rollout/sub/rel.py:1: osmosis_ai.rollout.sub.rel imports osmosis_ai.cli.main",
        "osmosis_ai/rollout/sub/rel.py:1: osmosis_ai.rollout.sub.rel imports "
        "osmosis_ai.cli.main.run",
        "osmosis_ai/rollout/top.py:1: osmosis_ai.rollout.top imports osmosis_ai.gateway.app",
    ]
    assert bad(NO_CLI) == [
        "osmosis_ai/gateway/app.py:3: osmosis_ai.gateway.app imports osmosis_ai.cli",
        "osmosis_ai/rollout/sub/rel.py:1: osmosis_ai.rollout.sub.rel imports osmosis_ai.cli.main",
        "osmosis_ai/rollout/sub/rel.py:1: osmosis_ai.rollout.sub.rel imports "
        "osmosis_ai.cli.main.run",
    ]
    assert bad(CONTRACT) == [
        "osmosis_ai/rollout/types.py:1: osmosis_ai.rollout.types imports "
        "osmosis_ai.rollout.backend.base",
        "osmosis_ai/rollout/types.py:1: osmosis_ai.rollout.types imports "
        "osmosis_ai.rollout.backend.base.Outcome",
    ]
