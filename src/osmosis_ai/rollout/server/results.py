"""Building what pollers receive: status answers and final results, encoded once."""

from __future__ import annotations

import json
import logging
from typing import Any

from osmosis_ai.redact import Redactor
from osmosis_ai.rollout._failures import describe
from osmosis_ai.rollout.backend.base import ExecutionResult
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus

__all__ = ["encode_final", "encode_status", "failure", "internal_failure"]

logger = logging.getLogger(__name__)


def failure(message: str, category: RolloutErrorCategory | None) -> ExecutionResult:
    """A failed result with ``message`` and ``category``."""
    return ExecutionResult(RolloutStatus.FAILURE, err_message=message, err_category=category)


def internal_failure(
    exc: Exception, *, phase: str, redactor: Redactor | None = None
) -> ExecutionResult:
    """The ``internal_error`` failure of a rollout whose machinery raised ``exc`` in ``phase``.

    For what is no fault of user code (a backend that broke its contract, an unreachable
    rollout server): user failures arrive as results, not exceptions. ``redactor``, when
    given, scrubs the message.
    """
    message = describe(exc, phase=phase)
    if redactor is not None:
        message = redactor.text(message)
    return failure(message, RolloutErrorCategory.INTERNAL_ERROR)


def _valid_text(value: str | None) -> str | None:
    # Lone surrogates (from broken decoding upstream) cannot be sent as UTF-8.
    if value is None:
        return None
    return value.encode("utf-8", "replace").decode("utf-8")


# Built once: ``json.dumps`` with options builds a new encoder on every call.
_UTF8 = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_ASCII = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def _dumps(data: dict[str, Any]) -> bytes:
    text = _UTF8.encode(data)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Messages holding lone surrogates: escape them rather than fail the result.
        return _ASCII.encode(data).encode("ascii")


def _wire_sample(sample: RolloutSample, status: RolloutStatus) -> dict[str, Any]:
    safe = sample.json_safe_copy()
    kept = status is RolloutStatus.SUCCESS and not safe.remove_sample
    return {
        "messages": safe.messages,
        "label": _valid_text(safe.label),
        # Consumers use any number they see; only a kept, successful sample has a reward.
        "reward": safe.reward if kept else None,
        "remove_sample": safe.remove_sample,
        "metrics": safe.metrics,
        "extra_fields": safe.extra_fields,
        # Only when a workflow or grader set some: the wire stays the reference's otherwise
        # (whose clients ignore a key they do not know).
        **({"turn_rewards": dict(safe.turn_rewards)} if kept and safe.turn_rewards else {}),
    }


def encode_status(rollout_id: str, status: RolloutStatus) -> bytes:
    """The answer to a poll of an unfinished rollout."""
    return _dumps(
        {
            "rollout_id": rollout_id,
            "status": status.value,
            "sample": None,
            "err_message": None,
            "err_category": None,
        }
    )


def encode_final(rollout_id: str, result: ExecutionResult, redactor: Redactor) -> bytes:
    """The final answer of a rollout, JSON-encoded once and kept for every later poll.

    ``trajectory_messages`` never travels; metrics and extra fields are made JSON-safe; a
    sample that still cannot be encoded shrinks to its label, reward and removal flag.
    """
    message = result.err_message
    if message is not None:
        message = _valid_text(redactor.text(message))
    body: dict[str, Any] = {
        "rollout_id": rollout_id,
        "status": result.status.value,
        "sample": None,
        "err_message": message,
        "err_category": result.err_category.value if result.err_category else None,
    }
    if result.sample is None:
        return _dumps(body)
    body["sample"] = _wire_sample(result.sample, result.status)
    try:
        return _dumps(body)
    except (TypeError, ValueError) as exc:
        logger.warning(
            "rollout %s: sample messages are not JSON-encodable (%s); sending label and "
            "reward only",
            rollout_id,
            type(exc).__name__,
        )
        full = body["sample"]
        body["sample"] = {
            "messages": [],
            "label": full["label"],
            "reward": full["reward"],
            "remove_sample": full["remove_sample"],
            "metrics": {},
            "extra_fields": {},
        }
        return _dumps(body)
