"""Execution backends: what runs a rollout's workflow and grader."""

from osmosis_ai.rollout.backend.base import (
    ExecutionBackend,
    ExecutionOutcome,
    ExecutionRequest,
    ExecutionResult,
)
from osmosis_ai.rollout.backend.local import LocalBackend

__all__ = [
    "ExecutionBackend",
    "ExecutionOutcome",
    "ExecutionRequest",
    "ExecutionResult",
    "LocalBackend",
]
