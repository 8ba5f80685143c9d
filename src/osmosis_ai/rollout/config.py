"""Configuration models that users extend for their workflows and graders."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["AgentWorkflowConfig", "BaseConfig", "ConcurrencyConfig", "GraderConfig"]


class ConcurrencyConfig(BaseModel):
    """How many executions may run at once.

    ``max_concurrent=None`` (the default) means no cap inside the backend: the controller's
    number of in-flight rollouts is the limit. With a cap, a backend reports no capacity
    when the cap is reached, so a rollout server answers 429 instead of queueing work whose
    deadline is already running.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    max_concurrent: int | None = Field(default=None, ge=1)
    """Maximum simultaneous executions; ``None`` for no cap."""


class BaseConfig(BaseModel):
    """Base of workflow and grader configs.

    Extra fields are allowed so a simple config needs no boilerplate, and assignments are
    validated so a typo'd type fails where it is made.
    """

    model_config = ConfigDict(
        extra="allow",
        validate_assignment=True,
        arbitrary_types_allowed=True,
        use_attribute_docstrings=True,
    )

    name: str
    """Identifier of the workflow or grader."""

    description: str | None = None
    """Optional human-readable description."""


class AgentWorkflowConfig(BaseConfig):
    """Config of an ``AgentWorkflow``; subclass it to add your own fields."""

    concurrency: ConcurrencyConfig = ConcurrencyConfig()
    """Cap on simultaneous workflow executions in one backend."""


class GraderConfig(BaseConfig):
    """Config of a ``Grader``; subclass it to add your own fields."""

    concurrency: ConcurrencyConfig = ConcurrencyConfig()
    """Cap on simultaneous gradings in one backend."""
