"""Rollout status, error-category and cancel vocabularies shared by the backend and the wire."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

__all__ = ["TERMINAL_STATUSES", "CancelDisposition", "RolloutErrorCategory", "RolloutStatus"]


class RolloutStatus(StrEnum):
    """Lifecycle status of a rollout as pollers see it."""

    QUEUED = "queued"
    RUNNING = "running"
    GRADING = "grading"
    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


#: Statuses after which a rollout never changes again.
TERMINAL_STATUSES = frozenset(
    {RolloutStatus.SUCCESS, RolloutStatus.FAILURE, RolloutStatus.CANCELLED}
)


class RolloutErrorCategory(StrEnum):
    """Why a rollout failed, as reported on the wire."""

    TIMEOUT = "timeout"
    VALIDATION_ERROR = "validation_error"
    HTTP_ERROR = "http_error"
    AGENT_ERROR = "agent_error"
    GRADER_ERROR = "grader_error"
    """The grader raised or crashed (an osmosis_ai extension of the reference's vocabulary:
    there a grader's exception is an ``agent_error``)."""
    JUDGE_ERROR = "judge_error"
    """A model judge the grader asked failed, timed out or answered no valid score (ours too):
    never a silent 0."""
    LEASE_EXPIRED = "lease_expired"
    INTERNAL_ERROR = "internal_error"


#: What a cancel request did to one rollout.
CancelDisposition = Literal["cancelled_queued", "cancelled_running", "not_found"]
