"""Reading ATIF step fields (tool calls, usage, token data, timestamps) off chat messages."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeGuard

from osmosis_ai.rollout.sample import JSONObject
from osmosis_ai.rollout.trajectory._content import compact_json

__all__ = [
    "message_metrics",
    "message_model_name",
    "message_timestamp",
    "parse_arguments",
    "parse_tool_calls",
    "reasoning_text",
]

_TIMESTAMP_KEYS = ("created_at", "timestamp", "completed_at")


def _reject_constant(name: str) -> Any:
    # json.loads accepts NaN/Infinity by default; they are not JSON and would fail the save.
    raise ValueError(f"{name} is not valid JSON")


_ARGUMENTS_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    # Messages are plain dicts almost always; the Mapping ABC check is the slow fallback.
    return type(value) is dict or (value is not None and isinstance(value, Mapping))


def parse_arguments(raw: object) -> JSONObject:
    """Tool-call arguments as a JSON object.

    A mapping is kept; a string holding a JSON object is parsed; any other string is kept
    as ``{"_raw": string}``; ``None`` or a blank string gives ``{}``.
    """
    if raw is None:
        return {}
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            parsed = _ARGUMENTS_DECODER.decode(raw)
        except (ValueError, RecursionError):
            return {"_raw": raw}
        return parsed if isinstance(parsed, dict) else {"_raw": raw}
    if _is_mapping(raw):
        return {str(key): value for key, value in raw.items()}
    return {"_raw": compact_json(raw)}


def parse_tool_calls(value: object) -> list[JSONObject]:
    """ATIF tool calls from an OpenAI ``tool_calls`` list; malformed entries are skipped."""
    if not isinstance(value, list | tuple):
        return []
    calls: list[JSONObject] = []
    for index, entry in enumerate(value):
        if not _is_mapping(entry):
            continue
        function = entry.get("function")
        if function is None:
            function = {}
        elif not _is_mapping(function):
            continue
        call_id = entry.get("id")
        name = function.get("name")
        calls.append(
            {
                "tool_call_id": call_id
                if isinstance(call_id, str) and call_id
                else f"call_{index}",
                "function_name": name if isinstance(name, str) and name else "unknown",
                "arguments": parse_arguments(function.get("arguments")),
            }
        )
    return calls


def reasoning_text(value: object) -> str | None:
    """``reasoning_content`` as text; non-string values are JSON-encoded."""
    if value is None or isinstance(value, str):
        return value
    return compact_json(value)


def _response(message: Mapping[str, Any]) -> Mapping[str, Any]:
    extra = message.get("extra")
    if not _is_mapping(extra):
        return {}
    response = extra.get("response")
    return response if _is_mapping(response) else {}


def message_model_name(message: Mapping[str, Any]) -> str | None:
    """The model named by ``model``/``model_name`` or ``extra.response.model``."""
    for candidate in (
        message.get("model"),
        message.get("model_name"),
        _response(message).get("model"),
    ):
        if isinstance(candidate, str) and candidate:
            return candidate
    return None


def _count(value: object) -> int | None:
    # Token counts are integers; providers sometimes send 12.0, never "12" or True.
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    as_float = float(value)
    return as_float if math.isfinite(as_float) else None


def _first_count(usage: Mapping[str, Any], *keys: str) -> int | None:
    # The first key present wins, so an explicit 0 is kept rather than skipped.
    for key in keys:
        count = _count(usage.get(key))
        if count is not None:
            return count
    return None


def _numbers_and_sum(value: object) -> tuple[list[Any] | tuple[Any, ...], int | float] | None:
    """A non-empty list or tuple of numbers and its sum; ``None`` for anything else."""
    # These lists can hold thousands of items: sum() checks them at C speed (it fails on
    # non-numbers and gives a float if any item is one).
    if not isinstance(value, list | tuple) or not value:
        return None
    try:
        total = sum(value)
    except TypeError:
        return None
    return (value, total) if isinstance(total, int | float) else None


def _token_ids(value: object) -> list[int] | tuple[int, ...] | None:
    # An int sum proves every item an int. Validation copies the list later.
    summed = _numbers_and_sum(value)
    return summed[0] if summed is not None and isinstance(summed[1], int) else None


def _logprobs(value: object) -> list[float] | tuple[float, ...] | None:
    # Plain list of floats, or OpenAI's {"content": [{"token": ..., "logprob": ...}, ...]}.
    if _is_mapping(value):
        entries = value.get("content")
        if not isinstance(entries, list | tuple):
            return None
        value = [entry.get("logprob") if _is_mapping(entry) else None for entry in entries]
    summed = _numbers_and_sum(value)
    if summed is None:
        return None
    items, total = summed
    # A finite sum proves every item finite. One NaN or infinity makes the list unusable:
    # dropping the item would shift the positions of all later ones.
    if not math.isfinite(total) and not all(map(math.isfinite, items)):
        return None
    return items


def _usage_metrics(usage: Mapping[str, Any]) -> JSONObject:
    metrics: JSONObject = {
        "prompt_tokens": _first_count(usage, "prompt_tokens", "input_tokens"),
        "completion_tokens": _first_count(usage, "completion_tokens", "output_tokens"),
        "cached_tokens": _count(usage.get("cached_tokens")),
        "cost_usd": _finite(usage.get("cost_usd")),
    }
    if metrics["cached_tokens"] is None:
        for key in ("prompt_tokens_details", "input_tokens_details"):
            details = usage.get(key)
            if _is_mapping(details):
                metrics["cached_tokens"] = _count(details.get("cached_tokens"))
                if metrics["cached_tokens"] is not None:
                    break
    details_extra = {
        key: dict(value)
        for key, value in usage.items()
        if isinstance(key, str) and key.endswith("_tokens_details") and _is_mapping(value) and value
    }
    if details_extra:
        metrics["extra"] = details_extra
    return metrics


def message_metrics(message: Mapping[str, Any]) -> JSONObject | None:
    """ATIF step metrics from an assistant message, or ``None`` when it carries none.

    Reads ``usage`` (or ``extra.response.usage``) and the per-call token data keys
    ``prompt_token_ids``, ``completion_token_ids`` (alias ``token_ids``) and ``logprobs``.
    """
    usage = message.get("usage")
    if not _is_mapping(usage):
        usage = _response(message).get("usage")
    metrics = _usage_metrics(usage) if _is_mapping(usage) else {}
    completion_ids = message.get("completion_token_ids")
    if completion_ids is None:
        completion_ids = message.get("token_ids")
    metrics["prompt_token_ids"] = _token_ids(message.get("prompt_token_ids"))
    metrics["completion_token_ids"] = _token_ids(completion_ids)
    metrics["logprobs"] = _logprobs(message.get("logprobs"))
    present = {key: value for key, value in metrics.items() if value is not None}
    return present or None


def _iso_timestamp(value: object) -> str | None:
    if isinstance(value, bool):
        return None
    try:
        if isinstance(value, int | float):
            if not math.isfinite(value):
                return None
            return datetime.fromtimestamp(value, tz=UTC).isoformat()
        if isinstance(value, str):
            return datetime.fromisoformat(value.strip()).isoformat()
        if isinstance(value, datetime):
            return value.isoformat()
    except (ValueError, OverflowError, OSError):  # out-of-range epochs raise the latter two
        return None
    return None


def message_timestamp(message: Mapping[str, Any]) -> str | None:
    """The message time as ISO-8601, or ``None``.

    The first parseable of ``created_at``, ``timestamp``, ``completed_at`` and
    ``extra.timestamp`` wins; epoch numbers are read as UTC.
    """
    extra = message.get("extra")
    candidates = [message.get(key) for key in _TIMESTAMP_KEYS]
    if _is_mapping(extra):
        candidates.append(extra.get("timestamp"))
    for candidate in candidates:
        if candidate is not None:
            stamp = _iso_timestamp(candidate)
            if stamp is not None:
                return stamp
    return None
