"""The wire models belong to the contract layer: they never reach up into the backends."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path


def _own_imports(module: str) -> set[str]:
    # The modules named by the import statements of ``module``'s own source.
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            # ``from package import module`` names a module too.
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _reachable(start: str) -> set[str]:
    # Follows package-internal imports transitively, one bounded pass per module.
    seen: set[str] = set()
    pending = [start]
    while pending:
        module = pending.pop()
        if module in seen or not module.startswith("osmosis_ai."):
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:  # ``from pkg import name`` where name is not a module
            continue
        seen.add(module)
        pending.extend(_own_imports(module) - seen)
    return seen


def test_wire_types_do_not_import_the_backend_layer() -> None:
    reachable = _reachable("osmosis_ai.rollout.types")
    assert "osmosis_ai.rollout.status" in reachable  # the walk does follow imports
    upward = sorted(name for name in reachable if name.startswith("osmosis_ai.rollout.backend"))
    assert upward == [], f"osmosis_ai.rollout.types reaches {upward}"


def test_cancel_disposition_keeps_its_backend_import_path() -> None:
    from osmosis_ai.rollout.backend.base import CancelDisposition as from_backend
    from osmosis_ai.rollout.types import CancelDisposition as from_types

    assert from_backend is from_types
