"""``RolloutSpec``: what a rollout runs (workflow and grader classes with their configs).

Every backend is built from one; each backend's keyword spelling (``workflow=...``,
``grader=...``) resolves to it. `osmosis_ai.rollout.backend.spec` ships it to another
process or into a bundle.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar, Unpack

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout._imports import resolve_object
from osmosis_ai.rollout.config import AgentWorkflowConfig, BaseConfig, GraderConfig
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.workflow import AgentWorkflow

__all__ = ["GraderRef", "RolloutSpec", "SpecKeywords", "WorkflowRef", "spec_argument"]

C = TypeVar("C", bound=BaseConfig)
K = TypeVar("K", bound=type)

#: A workflow class or its ``"module:Class"`` import path.
WorkflowRef = type[AgentWorkflow[Any]] | str
#: A grader class or its ``"module:Class"`` import path.
GraderRef = type[Grader] | str


class SpecKeywords(TypedDict, total=False):
    """A backend's keyword spelling of a `RolloutSpec` (``LocalBackend(workflow=...)``)."""

    workflow: WorkflowRef | None
    workflow_config: AgentWorkflowConfig | str | None
    grader: GraderRef | None
    grader_config: GraderConfig | str | None


@dataclass(frozen=True)
class RolloutSpec:
    """The workflow and grader of a rollout, resolved and checked.

    Build it with `resolve` (which accepts import paths); the constructor takes the
    objects as they are. ``workflow`` is ``None`` only where nothing runs a workflow
    (grading a native Harbor agent's work, the grader phase of a container).
    """

    workflow: type[AgentWorkflow[Any]] | None
    workflow_config: AgentWorkflowConfig | None = None
    grader: type[Grader] | None = None
    grader_config: GraderConfig | None = None

    @classmethod
    def resolve(
        cls,
        *,
        workflow: WorkflowRef | None = None,
        workflow_config: AgentWorkflowConfig | str | None = None,
        grader: GraderRef | None = None,
        grader_config: GraderConfig | str | None = None,
        workflow_label: str = "workflow",
    ) -> RolloutSpec:
        """Resolve ``"module:attr"`` references and check every object's kind.

        Args:
            workflow_label: The argument's name in error messages (Harbor calls it
                ``agent``).

        Raises:
            ConfigError: A reference does not resolve to the right kind of object, or a
                config cannot be deep-copied (every rollout gets a private copy).
        """
        return cls(
            workflow=None
            if workflow is None
            else _resolve_class(workflow, AgentWorkflow, workflow_label),
            workflow_config=_resolve_config(
                workflow_config, AgentWorkflowConfig, "workflow_config"
            ),
            grader=None if grader is None else _resolve_class(grader, Grader, "grader"),
            grader_config=_resolve_config(grader_config, GraderConfig, "grader_config"),
        )

    @property
    def max_concurrent(self) -> int | None:
        """The workflow config's concurrency cap (``None``: no cap)."""
        config = self.workflow_config
        return config.concurrency.max_concurrent if config is not None else None

    def require_workflow(self, label: str = "workflow") -> type[AgentWorkflow[Any]]:
        """The workflow class.

        Raises:
            ConfigError: The spec has none.
        """
        if self.workflow is None:
            raise ConfigError(f"{label} is required: pass an AgentWorkflow subclass")
        return self.workflow


def spec_argument(
    spec: RolloutSpec | None,
    *,
    workflow_label: str = "workflow",
    require_workflow: bool = False,
    **refs: Unpack[SpecKeywords],
) -> RolloutSpec:
    """A backend's spec: ``spec`` itself, or one resolved from its keyword spelling.

    Args:
        workflow_label: The workflow argument's name in error messages.
        require_workflow: Refuse a spec without a workflow (the backend runs workflows).

    Raises:
        ConfigError: Both a spec and keywords, a bad reference, or a missing workflow.
    """
    if spec is None:
        spec = RolloutSpec.resolve(workflow_label=workflow_label, **refs)
    elif any(ref is not None for ref in refs.values()):
        raise ConfigError(
            f"pass either spec= or {workflow_label}=/workflow_config=/grader=/grader_config=, "
            "not both"
        )
    if require_workflow:
        spec.require_workflow(workflow_label)
    return spec


def _resolve_class(ref: object, base: K, label: str) -> K:
    obj = resolve_object(ref, label=label)
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise ConfigError(f"{label} must be a subclass of {base.__name__}, got {obj!r}")
    return obj  # type: ignore[return-value]


def _resolve_config(ref: object, base: type[C], label: str) -> C | None:
    if ref is None:
        return None
    obj = resolve_object(ref, label=label)
    if not isinstance(obj, base):
        raise ConfigError(f"{label} must be a {base.__name__} instance, got {type(obj).__name__}")
    try:
        copy.deepcopy(obj)
    except Exception as exc:
        # Each rollout gets a private copy; find out now rather than on the first rollout.
        raise ConfigError(
            f"{label} cannot be deep-copied ({type(exc).__name__}); every rollout receives a "
            "private copy, so keep non-copyable resources out of the config"
        ) from exc
    return obj
