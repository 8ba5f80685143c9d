"""``HistorySource``: a sample source over a message list that a workflow appends to."""

from __future__ import annotations

from typing import Any

from osmosis_ai.rollout.context import SampleSource
from osmosis_ai.rollout.deep_copy import deep_copy
from osmosis_ai.rollout.sample import RolloutSample

__all__ = ["HistorySource"]


class HistorySource(SampleSource):
    """The simplest previewable source: append to ``messages``; the sample is a copy of it.

    Args:
        messages: The starting history (copied).
        revision: Whether to report ``preview_revision()`` (the length of the history), so
            the preview collector skips unchanged histories; ``False`` makes it ask every time.

    Attributes:
        messages: The history, OpenAI chat-shaped.
        preview_calls: How often ``get_preview`` was called (tests count the collector's looks).
    """

    def __init__(self, messages: list[dict[str, Any]] | None = None, *, revision: bool = True):
        self.messages: list[dict[str, Any]] = list(messages or [])
        self.preview_calls = 0
        self._revision = revision

    async def get_sample(self) -> RolloutSample:
        return RolloutSample(messages=deep_copy(self.messages))

    def preview_revision(self) -> int | None:
        return len(self.messages) if self._revision else None

    async def get_preview(self, max_messages: int) -> RolloutSample | None:
        self.preview_calls += 1
        if max_messages <= 0:
            return None
        recent = deep_copy(self.messages[-max_messages:])
        return RolloutSample(messages=recent, trajectory_messages=recent)
