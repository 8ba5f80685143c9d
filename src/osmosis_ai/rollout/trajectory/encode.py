"""Indented JSON encoding of trajectory documents, with number arrays kept on one line."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_json, to_jsonable_python

from osmosis_ai._unique import token_hex
from osmosis_ai.rollout.sample import JSONObject
from osmosis_ai.rollout.trajectory import atif

__all__ = ["encode_document"]

_NUMBER_TYPES = frozenset({int, float})
# Models whose dump is exactly their non-None __dict__ (no extras, no computed fields).
_PLAIN_MODELS = frozenset(getattr(atif, name) for name in atif.__all__)

_Array = list[Any] | tuple[Any, ...]
_Arrays = list[_Array]


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"Out of range float values are not JSON compliant: {value!r}")
    return value


def _number_total(array: _Array) -> int | float | None:
    # sum() checks a whole array at C speed: it fails on strings, None and containers.
    # Its result is finite only when every item is, so non-finite items are found here.
    try:
        total = sum(array)
    except TypeError:
        return None
    if type(total) is float and not math.isfinite(total):
        for item in array:
            if type(item) is float:
                _finite(item)  # raises on NaN/infinity; else the sum merely overflowed
    return total if type(total) is int or type(total) is float else None


def _json_key(key: object) -> str:
    # The key coercions of json.dumps (pydantic-core would write None as "None").
    if isinstance(key, str):
        return key
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int | float):
        return repr(_finite(key))
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


# The document is copied with each non-empty array of numbers swapped for a placeholder;
# pydantic-core then writes the indented skeleton and all the arrays in two native calls,
# several times faster than json.dumps(indent=2) followed by a regex pass over its output.
# ATIF models are read field by field, leaving out None (as model_dump(exclude_none=True)
# would), which saves dumping them to dicts first.


def _skeleton_model(model: BaseModel, arrays: _Arrays, placeholder: str) -> JSONObject:
    copy: JSONObject = {}
    for name, item in model.__dict__.items():
        if item is None:
            continue
        kind = type(item)
        if kind is list:
            item = _skeleton_array(item, arrays, placeholder)
        elif kind in _PLAIN_MODELS:
            item = _skeleton_model(item, arrays, placeholder)
        elif kind is not str and kind is not int and kind is not bool:
            item = _skeleton_value(item, arrays, placeholder)
        copy[name] = item
    return copy


def _skeleton_mapping(mapping: dict[Any, Any], arrays: _Arrays, placeholder: str) -> JSONObject:
    copy: JSONObject = {}
    for key, item in mapping.items():
        kind = type(item)
        if kind is dict:
            item = _skeleton_mapping(item, arrays, placeholder)
        elif kind is list or kind is tuple:
            item = _skeleton_array(item, arrays, placeholder)
        elif kind is float:
            _finite(item)
        elif kind is not str and kind is not int and item is not None:
            item = _skeleton_value(item, arrays, placeholder)
        copy[key if type(key) is str else _json_key(key)] = item
    return copy


def _skeleton_array(array: _Array, arrays: _Arrays, placeholder: str) -> Any:
    if array and type(array[0]) in _NUMBER_TYPES and _number_total(array) is not None:
        arrays.append(array)
        return placeholder
    return [_skeleton_value(item, arrays, placeholder) for item in array]


def _skeleton_value(value: Any, arrays: _Arrays, placeholder: str) -> Any:
    kind = type(value)
    if kind in _PLAIN_MODELS:
        return _skeleton_model(value, arrays, placeholder)
    if kind is list or kind is tuple:
        return _skeleton_array(value, arrays, placeholder)
    if kind is float:
        return _finite(value)
    if kind is dict:
        return _skeleton_mapping(value, arrays, placeholder)
    if isinstance(value, BaseModel):  # not an ATIF model: let pydantic dump it
        dumped = to_jsonable_python(value, exclude_none=True)
        return _skeleton_value(dumped, arrays, placeholder)
    if isinstance(value, dict):
        return _skeleton_mapping(value, arrays, placeholder)
    return value


def _repaired(value: Any) -> Any:
    # Lone surrogates cannot be written as UTF-8: they become "\\udXXX" text instead.
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_repaired(key): _repaired(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_repaired(item) for item in value]
    return value


def _render(document: Any) -> bytes:
    placeholder = f"\ue000{token_hex()}"
    arrays: _Arrays = []
    text = to_json(_skeleton_value(document, arrays, placeholder), indent=2)
    if not arrays:
        return text + b"\n"
    # "[[1,2],[3]]": number arrays hold no brackets, so each one ends at the next "]".
    packed = to_json(arrays)
    view = memoryview(packed)
    pieces = text.split(b'"' + placeholder.encode("utf-8") + b'"')
    out: list[bytes | memoryview] = [pieces[0]]
    start = 1
    for piece in pieces[1:]:
        end = packed.index(b"]", start) + 1
        out += (view[start:end], piece)
        start = end + 1
    if len(pieces) != len(arrays) + 1 or start != len(packed):
        raise ValueError("internal error: number array placeholders do not match")
    out.append(b"\n")
    return b"".join(out)


def encode_document(document: Any) -> bytes:
    """UTF-8 JSON text of ``document``, indented by 2, with number arrays on one line.

    ``document`` is JSON data, or a pydantic model standing for its
    ``model_dump(mode="json", exclude_none=True)``. The text is that of
    ``json.dumps(document, indent=2, allow_nan=False, ensure_ascii=False)``
    except that every non-empty array of numbers is written compactly on one line
    (``[1,2,3]``: token-id and logprob arrays hold thousands of numbers),
    floats use the shortest round-trip form (``1e-05`` may print as ``0.00001``), and lone
    surrogates (not encodable as UTF-8) are written as ``\\udXXX`` text. Ends with a newline.

    Raises:
        ValueError: ``document`` contains NaN or an infinity.
        TypeError: ``document`` has a dict key JSON cannot represent.
        pydantic_core.PydanticSerializationError: a value JSON cannot represent.
    """
    try:
        return _render(document)
    except PydanticSerializationError:
        # Almost always a lone surrogate; anything else fails again and propagates.
        return _render(_repaired(to_jsonable_python(document, exclude_none=True)))
