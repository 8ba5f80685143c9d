"""``Grader``: the class users subclass to turn a sample into a reward."""

from __future__ import annotations

from abc import ABC, abstractmethod

from osmosis_ai.rollout.config import GraderConfig
from osmosis_ai.rollout.context import GraderContext

__all__ = ["Grader"]


class Grader(ABC):
    """Decides the reward of the sample a workflow produced.

    The backend builds a fresh instance for every grading (with a private deep copy of the
    config) and calls ``grade()`` once. The grader communicates only by changing the sample:
    call ``ctx.set_reward(value)`` with a finite number, or set
    ``ctx.sample.remove_sample = True`` to exclude the sample from training. A kept sample
    without a reward fails the rollout with ``validation_error``.

    The grader runs when the backend has one, the request asks for grading (``grade=True``)
    and the workflow succeeded with a sample. ``ctx.label`` holds the row's ground truth and
    ``ctx.metadata`` its metadata; a request with neither cannot be graded and fails with a
    message saying so.

    Example:
        ```python
        class ExactMatch(Grader):
            async def grade(self, ctx: GraderContext) -> None:
                answer = ctx.sample.messages[-1]["content"] if ctx.sample else ""
                ctx.set_reward(1.0 if answer.strip() == ctx.label else 0.0)
        ```
    """

    def __init__(self, config: GraderConfig | None = None) -> None:
        """Store the grader config (``None`` when the backend was given none)."""
        self.config = config

    @abstractmethod
    async def grade(self, ctx: GraderContext) -> None:
        """Grade ``ctx.sample``, usually by calling ``ctx.set_reward``.

        Args:
            ctx: The sample, the row's label and metadata, and the artifacts directory.

        Returns:
            Nothing; a returned value is ignored.
        """
