"""The rollout side of osmosis_ai: the contract users implement, and the in-process backend.

Importing this package loads no server, gateway or agent framework.
"""

from osmosis_ai.rollout.backend.base import (
    ExecutionBackend,
    ExecutionOutcome,
    ExecutionRequest,
    ExecutionResult,
)
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.config import (
    AgentWorkflowConfig,
    BaseConfig,
    ConcurrencyConfig,
    GraderConfig,
)
from osmosis_ai.rollout.context import (
    AgentWorkflowContext,
    GraderContext,
    RolloutContext,
    SampleSource,
    get_rollout_context,
)
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.judge import JudgeGrader, JudgeGraderConfig
from osmosis_ai.rollout.sample import AgentWorkflowOutput, RolloutSample
from osmosis_ai.rollout.spec import RolloutSpec
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus
from osmosis_ai.rollout.workflow import AgentWorkflow

__all__ = [
    "AgentWorkflow",
    "AgentWorkflowConfig",
    "AgentWorkflowContext",
    "AgentWorkflowOutput",
    "BaseConfig",
    "ConcurrencyConfig",
    "ExecutionBackend",
    "ExecutionOutcome",
    "ExecutionRequest",
    "ExecutionResult",
    "Grader",
    "GraderConfig",
    "GraderContext",
    "JudgeGrader",
    "JudgeGraderConfig",
    "LocalBackend",
    "RolloutContext",
    "RolloutErrorCategory",
    "RolloutSample",
    "RolloutSpec",
    "RolloutStatus",
    "SampleSource",
    "get_rollout_context",
]
