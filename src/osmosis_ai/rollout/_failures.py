"""Turning an exception that ended a rollout phase into a wire category and a message."""

from __future__ import annotations

import pydantic

from osmosis_ai.errors import OsmosisError
from osmosis_ai.rollout.status import RolloutErrorCategory

__all__ = ["categorize", "describe", "user_code_error"]

# Validation errors of these models mean the workflow or grader produced an invalid sample
# (a NaN metric, an unknown field), not that user code crashed.
_CONTRACT_MODELS = frozenset({"AgentWorkflowOutput", "RolloutSample"})

_MAX_MESSAGE = 2000


def categorize(exc: BaseException, *, phase: str) -> RolloutErrorCategory:
    """The wire category of an exception that ended ``phase`` (``"grader"`` or another).

    Our own errors declare their category. A ``TimeoutError`` is a timeout wherever it comes
    from. A validation error of a contract model is a ``validation_error``. Anything else
    raised by user code is an ``agent_error``, or a ``grader_error`` in the grader: a
    ``ValueError`` inside an agent is a bug in the agent, not a validation failure of the
    sample, and the category names whose code to look at.
    """
    if isinstance(exc, OsmosisError):
        return RolloutErrorCategory(exc.category)
    if isinstance(exc, TimeoutError):
        return RolloutErrorCategory.TIMEOUT
    if isinstance(exc, pydantic.ValidationError) and exc.title in _CONTRACT_MODELS:
        return RolloutErrorCategory.VALIDATION_ERROR
    return user_code_error(phase)


def user_code_error(phase: str) -> RolloutErrorCategory:
    """The category of user code that raised or crashed in ``phase``."""
    if phase == "grader":
        return RolloutErrorCategory.GRADER_ERROR
    return RolloutErrorCategory.AGENT_ERROR


def describe(exc: BaseException, *, phase: str) -> str:
    """A one-line message naming the phase, the exception type and its text (capped)."""
    text = " ".join(str(exc).split())
    if len(text) > _MAX_MESSAGE:
        text = text[:_MAX_MESSAGE] + " [truncated]"
    kind = type(exc).__name__
    return f"{phase} raised {kind}: {text}" if text else f"{phase} raised {kind}"
