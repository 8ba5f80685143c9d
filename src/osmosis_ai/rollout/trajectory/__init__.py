"""ATIF trajectories: converting a rollout's sample to a document, and saving it."""

from __future__ import annotations

from osmosis_ai.rollout.trajectory.convert import (
    convert_sample_to_trajectory,
    messages_from_trajectory,
)
from osmosis_ai.rollout.trajectory.report import LlmCallMetrics, SampleReport, TrajectoryReport
from osmosis_ai.rollout.trajectory.save import save_diagnostics, save_trajectory

__all__ = [
    "LlmCallMetrics",
    "SampleReport",
    "TrajectoryReport",
    "convert_sample_to_trajectory",
    "messages_from_trajectory",
    "save_diagnostics",
    "save_trajectory",
]
