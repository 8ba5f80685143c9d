"""Row normalisation: turns one dataset row into the prompt, label and metadata of a rollout.

This is the contract shared with the cloud controller:

- a ``metadata`` column makes the row a metadata row: its value must be a JSON object or a
  string encoding one (empty, blank or ``{}`` counts as absent) and the prompt columns are
  optional;
- otherwise ``user_prompt`` is required, and so is ``ground_truth`` (``label`` is accepted as an
  alias; ``ground_truth`` wins);
- ``system_prompt`` is optional; the prompt is the system message (if any) then the user
  message (if any), and a row with neither a prompt nor metadata is an error;
- empty strings, None and NaN (an empty CSV or Parquet cell) count as missing, other non-string
  values are ``str()``-ed, and other columns are ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from osmosis_ai.errors import DatasetRowError

__all__ = ["DatasetRow", "normalize_dataset_row"]

_METADATA = "metadata"
_SYSTEM_PROMPT = "system_prompt"
_USER_PROMPT = "user_prompt"
_GROUND_TRUTH = "ground_truth"
_LABEL = "label"


@dataclass(frozen=True)
class DatasetRow:
    """One dataset row, normalised into what a rollout starts from."""

    prompt: list[dict[str, Any]]
    """Initial chat messages: ``{"role": "system", ...}`` if any, then ``{"role": "user", ...}``
    if any. Empty only for a metadata row without prompt columns."""

    label: str | None
    """The expected answer (``ground_truth``, else ``label``), passed to the grader and never
    placed in the prompt; None only for a metadata row without either column."""

    metadata: dict[str, Any] | None
    """The row's metadata object, or None when the row has no (or an empty) ``metadata`` value."""


def normalize_dataset_row(row: Mapping[str, Any], *, row_index: int | None = None) -> DatasetRow:
    """Turn one dataset row into a rollout's initial messages, label and metadata.

    Args:
        row: Column name to cell value, as read from a JSONL line, a CSV record or a Parquet
            row. Columns other than ``metadata``, ``system_prompt``, ``user_prompt``,
            ``ground_truth`` and ``label`` are ignored.
        row_index: The row's position, used only to point error messages at the row.

    Returns:
        The normalised row.

    Raises:
        DatasetRowError: ``metadata`` is not a JSON object; or, without a ``metadata`` column,
            ``user_prompt`` or ``ground_truth``/``label`` is missing; or a metadata row has
            neither a prompt nor metadata. The message names the row, the column and the fix.
    """
    if not isinstance(row, Mapping):
        raise DatasetRowError(
            f"expected a mapping of column names to values, got {type(row).__name__}",
            row=row_index,
        )
    system_prompt = _text_cell(row.get(_SYSTEM_PROMPT))
    user_prompt = _text_cell(row.get(_USER_PROMPT))
    label = _text_cell(row.get(_GROUND_TRUTH))
    if label is None:
        label = _text_cell(row.get(_LABEL))

    metadata: dict[str, Any] | None = None
    if _METADATA in row:
        metadata = _metadata_cell(row[_METADATA], row_index)
        if metadata is None and system_prompt is None and user_prompt is None:
            raise DatasetRowError(
                "the metadata is empty and there is no user_prompt or system_prompt; every row "
                "needs a prompt or a non-empty metadata object",
                row=row_index,
                column=_METADATA,
            )
    else:
        if user_prompt is None:
            raise DatasetRowError(
                "missing or empty; every row needs a user_prompt (or a non-empty metadata "
                "object in a 'metadata' column)",
                row=row_index,
                column=_USER_PROMPT,
            )
        if label is None:
            raise DatasetRowError(
                "missing or empty; every row without a 'metadata' column needs the expected "
                "answer in 'ground_truth' (or its alias 'label')",
                row=row_index,
                column=_GROUND_TRUTH,
            )

    prompt: list[dict[str, Any]] = []
    if system_prompt is not None:
        prompt.append({"role": "system", "content": system_prompt})
    if user_prompt is not None:
        prompt.append({"role": "user", "content": user_prompt})
    return DatasetRow(prompt=prompt, label=label, metadata=metadata)


def _is_missing(value: Any) -> bool:
    # CSV and Parquet readers give None or NaN for an empty cell.
    return value is None or (isinstance(value, float) and math.isnan(value))


def _text_cell(value: Any) -> str | None:
    if _is_missing(value):
        return None
    text = value if isinstance(value, str) else str(value)
    return text or None


def _metadata_cell(value: Any, row_index: int | None) -> dict[str, Any] | None:
    if _is_missing(value):
        return None
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = json.loads(value)
        except ValueError as exc:
            # The message quotes the parser's position, never the cell, which may hold secrets.
            raise DatasetRowError(
                f"not a JSON object: invalid JSON ({_json_error(exc)}); write a JSON object "
                'such as {"difficulty": "easy"} or leave the cell empty',
                row=row_index,
                column=_METADATA,
            ) from exc
    if not isinstance(value, Mapping):
        raise DatasetRowError(
            f"not a JSON object: got {_json_kind(value)}; write a JSON object such as "
            '{"difficulty": "easy"} or leave the cell empty',
            row=row_index,
            column=_METADATA,
        )
    return dict(value) or None


def _json_error(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    return type(exc).__name__


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a value of type {type(value).__name__}"
