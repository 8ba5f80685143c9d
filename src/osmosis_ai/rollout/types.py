"""Wire models of the remote rollout protocol (polling-lease generation).

A controller admits a rollout with ``POST /rollout`` (`RolloutInitRequest`), receives a
polling lease (`RolloutInitResponse`), and long-polls ``GET /rollout/{id}/result`` with the
lease in the ``X-Osmosis-Rollout-Lease`` header until the `RolloutResultResponse` is
terminal. ``POST /rollout/cancel`` (`CancelRolloutsRequest`) cancels by id, prefix or all.
Unknown fields are ignored so that newer peers can add some.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from osmosis_ai.rollout.ids import is_single_path_segment
from osmosis_ai.rollout.sample import FiniteNumber, JSONObject, TurnRewards
from osmosis_ai.rollout.status import (
    TERMINAL_STATUSES,
    CancelDisposition,
    RolloutErrorCategory,
    RolloutStatus,
)

__all__ = [
    "POLLING_LEASE_HEADER",
    "CancelDisposition",
    "CancelRolloutsRequest",
    "CancelRolloutsResponse",
    "Messages",
    "RolloutErrorCategory",
    "RolloutInitRequest",
    "RolloutInitResponse",
    "RolloutResultResponse",
    "RolloutStatus",
    "WireSample",
]

#: Header that carries the polling lease token on result polls.
POLLING_LEASE_HEADER = "X-Osmosis-Rollout-Lease"

#: A message list (OpenAI chat shape, or a framework's native items).
Messages = list[JSONObject]

_MAX_ID_LENGTH = 256

# A zero or negative deadline would fail every rollout at once as a timeout: refuse it.
_Deadline = Annotated[FiniteNumber, Field(gt=0)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)


class RolloutInitRequest(_Wire):
    """Body of ``POST /rollout``: one dataset row to run, and where its model endpoint is."""

    rollout_id: str = Field(min_length=1, max_length=_MAX_ID_LENGTH)
    """Id chosen by the controller; a single path segment, unique while retained."""

    initial_messages: Messages
    """The prompt; becomes ``ctx.prompt``."""

    chat_completions_url: str = Field(min_length=1)
    """OpenAI-compatible base URL of this rollout (clients append ``/chat/completions``)."""

    llm_api_key: str | None = Field(default=None, repr=False)
    """Bearer key for the model endpoint; omitted or non-empty. Never echoed or logged."""

    label: str | None = None
    """Ground truth, given only to the grader."""

    metadata: JSONObject | None = None
    """Row metadata, given to workflow and grader."""

    grade: bool = True
    """Run the grader after a successful workflow."""

    agent_timeout_sec: _Deadline | None = None
    """Workflow deadline in seconds from admission, positive; ``None`` for none."""

    grader_timeout_sec: _Deadline | None = None
    """Grader deadline in seconds from the start of grading, positive; ``None`` for none."""

    extra_fields: JSONObject | None = None
    """Controller data recorded in the saved trajectory (``extra.osmosis.request_extra_fields``).

    ``trajectory_report_url``, when present, names a URL (answered with the rollout's
    ``llm_api_key`` as bearer) that returns a trajectory report of the rollout's model calls;
    the server merges it into ``trajectory.json``.
    """

    @field_validator("rollout_id")
    @classmethod
    def _single_segment(cls, value: str) -> str:
        # The id names a directory and a URL path segment.
        if not is_single_path_segment(value) or not value.isprintable():
            raise ValueError(
                "must be a single printable path segment (no '/', '\\\\', NUL, '.' or '..')"
            )
        return value

    @field_validator("llm_api_key")
    @classmethod
    def _non_empty_key(cls, value: str | None) -> str | None:
        # An empty bearer is always a configuration mistake; omit the field instead.
        if value is not None and not value:
            raise ValueError("must be omitted or a non-empty string")
        return value


class RolloutInitResponse(_Wire):
    """Body of the 202 answer to ``POST /rollout``: the polling lease."""

    rollout_id: str
    status: RolloutStatus = RolloutStatus.QUEUED
    polling_lease_token: str = Field(min_length=1, repr=False)
    """Secret to send in ``X-Osmosis-Rollout-Lease`` on every result poll."""
    result_wait_timeout_sec: float = Field(gt=0, allow_inf_nan=False)
    """Longest a result poll waits before answering with the current status."""
    polling_lease_timeout_sec: float = Field(gt=0, allow_inf_nan=False)
    """A rollout not polled for this long is cancelled (``lease_expired``)."""

    @model_validator(mode="after")
    def _lease_outlives_wait(self) -> RolloutInitResponse:
        # Otherwise a poller that waits the full time would lose its lease meanwhile.
        if self.polling_lease_timeout_sec <= self.result_wait_timeout_sec:
            raise ValueError("polling_lease_timeout_sec must exceed result_wait_timeout_sec")
        return self


class WireSample(_Wire):
    """A rollout's sample as it travels: ``RolloutSample`` without ``trajectory_messages``."""

    messages: Messages = Field(default_factory=list)
    label: str | None = None
    reward: FiniteNumber | None = None
    """``null`` unless the rollout succeeded and the sample is kept."""
    remove_sample: bool = False
    metrics: dict[str, Any] = Field(default_factory=dict)
    extra_fields: dict[str, Any] = Field(default_factory=dict)
    turn_rewards: TurnRewards = Field(default_factory=dict)
    """Rewards of single model calls by index (JSON keys are text); absent unless set."""


class RolloutResultResponse(_Wire):
    """Body of ``GET /rollout/{id}/result``: the current status, or the final result."""

    rollout_id: str
    status: RolloutStatus
    sample: WireSample | None = None
    err_message: str | None = None
    err_category: RolloutErrorCategory | None = None

    @property
    def terminal(self) -> bool:
        """Whether this is the final result."""
        return self.status in TERMINAL_STATUSES


class CancelRolloutsRequest(_Wire):
    """Body of ``POST /rollout/cancel``: exactly one selector."""

    ids: list[str] | None = None
    prefix: str | None = None
    all: bool = False

    @model_validator(mode="after")
    def _one_selector(self) -> CancelRolloutsRequest:
        # Ambiguous requests must not cancel more than intended.
        chosen = (self.ids is not None) + (self.prefix is not None) + bool(self.all)
        if chosen != 1:
            raise ValueError("pass exactly one selector: ids, prefix, or all")
        return self


class CancelRolloutsResponse(_Wire):
    """Body of the answer to ``POST /rollout/cancel``."""

    dispositions: dict[str, CancelDisposition] = Field(default_factory=dict)
