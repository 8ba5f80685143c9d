"""How deeply a decoded JSON value nests, bounded so hostile values cannot exhaust the stack."""

from __future__ import annotations

from typing import Any, Final

__all__ = ["MAX_JSON_DEPTH", "nests_deeper_than"]

#: Deepest nesting a rollout request may have (the request object itself is level 1).
#: Real rows stay far below it; past a few hundred levels encoders and converters hit
#: Python's recursion limit, so such a value would fail later, far from its cause.
MAX_JSON_DEPTH: Final = 64

_CONTAINERS: Final = (dict, list, tuple)


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether dicts, lists and tuples in ``value`` nest more than ``limit`` levels.

    A scalar is level 0, a container one more than the container holding it. Iterative,
    and each container is visited once, so the work is bounded by the size of ``value``.
    """
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, _CONTAINERS) else []
    while stack:
        current, depth = stack.pop()
        if depth > limit:
            return True
        children = current.values() if isinstance(current, dict) else current
        stack.extend((child, depth + 1) for child in children if isinstance(child, _CONTAINERS))
    return False
