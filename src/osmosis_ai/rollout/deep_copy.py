"""Deep copies of message histories, fast for the JSON-shaped data they almost always are.

`copy.deepcopy` keeps a memo of every object and dispatches through the copy protocol per
node: several microseconds per message, paid for every sample and every preview look. Dicts,
lists and immutable scalars are copied here directly; anything else (framework objects,
tuples, sets) goes through `copy.deepcopy`. Unlike `copy.deepcopy`, an object referenced
twice in plain dicts and lists is copied twice: histories have no such sharing that matters.
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

__all__ = ["deep_copy"]

T = TypeVar("T")

_IMMUTABLE = frozenset({str, int, float, bool, type(None), bytes})


def deep_copy(value: T) -> T:
    """A deep copy of ``value``.

    Raises:
        Whatever `copy.deepcopy` raises for an object that cannot be copied, and
        `RecursionError` for a list or dict that contains itself.
    """
    return _copy(value)  # type: ignore[no-any-return]


def _copy(value: Any) -> Any:
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    if kind is dict:
        return {
            key if type(key) in _IMMUTABLE else copy.deepcopy(key): _copy(item)
            for key, item in value.items()
        }
    if kind is list:
        return [_copy(item) for item in value]
    return copy.deepcopy(value)
