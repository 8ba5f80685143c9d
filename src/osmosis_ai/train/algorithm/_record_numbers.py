"""A call record's token ids and logprobs, checked to be lists of numbers: a record in its
JSON form (``CallRecord.to_json``) is plain data, read back from wherever it was kept."""

from __future__ import annotations

from array import array
from typing import Any

from osmosis_ai.errors import ConfigError

__all__ = ["checked_numbers"]

_INT_CODES = frozenset("bBhHiIlLqQ")
_NUMBER_CODES = _INT_CODES | {"f", "d"}


def checked_numbers(values: object, *, floats: bool, name: str, rollout_id: str) -> list[Any]:
    """``values`` as a list of integers (of numbers when ``floats``).

    Raises:
        ConfigError: ``values`` is not a list of them; the error names the field ``name``.
    """
    # A CallRecord's arrays hold machine numbers by construction: only JSON lists are walked.
    if isinstance(values, array) and values.typecode in (_NUMBER_CODES if floats else _INT_CODES):
        return values.tolist()
    # JSON numbers: an integral logprob is fine, a boolean token id is not.
    allowed = (int, float) if floats else (int,)
    if isinstance(values, list | tuple | array) and all(
        isinstance(value, allowed) and not isinstance(value, bool) for value in values
    ):
        return list(values)
    expected = "numbers" if floats else "integers"
    raise ConfigError(
        f"call record of rollout {rollout_id!r}: {name!r} must be a list of {expected} "
        "(pass CallRecord objects or their to_json() form)"
    )
