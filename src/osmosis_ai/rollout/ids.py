"""Validation of ids that become filesystem path segments or URL path segments.

Public because the controller side (gateway, eval) validates the same ids the rollout side does.
"""

from __future__ import annotations

from osmosis_ai.errors import InvalidIdError

__all__ = ["ensure_single_path_segment", "is_single_path_segment"]

_FORBIDDEN = ("/", "\\", "\x00")


def is_single_path_segment(value: object) -> bool:
    """Whether ``value`` is a string usable as exactly one path segment.

    Rejects empty strings, ``.`` and ``..``, and anything containing ``/``, ``\\`` or NUL,
    so that ``root / value`` can never leave ``root``.
    """
    if not isinstance(value, str) or value in ("", ".", ".."):
        return False
    return not any(ch in value for ch in _FORBIDDEN)


def ensure_single_path_segment(value: object, *, label: str = "rollout_id") -> str:
    """Return ``value`` if it is a single safe path segment.

    Raises:
        InvalidIdError: ``value`` is not a string or would escape its directory.
    """
    if not is_single_path_segment(value):
        raise InvalidIdError(label, value)
    assert isinstance(value, str)
    return value
