"""``AgentWorkflow``: the class users subclass to define a rollout's behaviour."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic

from typing_extensions import TypeVar

from osmosis_ai.errors import OutputShapeError
from osmosis_ai.rollout.config import AgentWorkflowConfig
from osmosis_ai.rollout.context import AgentWorkflowContext
from osmosis_ai.rollout.sample import AgentWorkflowOutput, JSONObject

__all__ = ["AgentWorkflow", "WorkflowReturn", "normalize_output"]

TConfig = TypeVar("TConfig", bound=AgentWorkflowConfig, default=AgentWorkflowConfig)

#: The shapes ``run()`` may return.
WorkflowReturn = AgentWorkflowOutput | list[JSONObject] | None


class AgentWorkflow(ABC, Generic[TConfig]):
    """The behaviour of one rollout: given a dataset prompt, what the agent does.

    Subclass it and implement ``run()``. The backend builds a fresh instance for every
    rollout (with a private deep copy of the config) and calls ``run()`` once, inside an
    active ``RolloutContext`` whose ``chat_completions_url`` every LLM call must use.

    ``run()`` produces exactly one sample, in one of three ways:

    * return an ``AgentWorkflowOutput``: its ``messages`` become the sample and its
      ``metrics`` are attached;
    * return a list of message dicts: wrapped as ``AgentWorkflowOutput(messages=...)``;
    * return ``None``: the sample is read from the ``SampleSource`` registered on the
      ambient ``RolloutContext`` (the Strands and OpenAI Agents integrations register one).

    Keep task answers out of ``run()``: the label is given only to the ``Grader``.

    Example:
        ```python
        class ExplicitWorkflow(AgentWorkflow):
            async def run(self, ctx: AgentWorkflowContext) -> AgentWorkflowOutput:
                messages = [*ctx.prompt, {"role": "assistant", "content": "done"}]
                return AgentWorkflowOutput(messages=messages, metrics={"steps": 1.0})
        ```
    """

    def __init__(self, config: TConfig | None = None) -> None:
        """Store the workflow config (``None`` when the backend was given none)."""
        self.config = config

    @abstractmethod
    async def run(self, ctx: AgentWorkflowContext[TConfig]) -> WorkflowReturn:
        """Run the agent for one dataset row.

        Args:
            ctx: The row's prompt and metadata, the config and the artifacts directory.

        Returns:
            An ``AgentWorkflowOutput``, a message list, or ``None`` (use the sample source).
        """


def normalize_output(value: object) -> AgentWorkflowOutput | None:
    """Turn what ``run()`` returned into a validated output, or ``None`` for "use the source".

    Raises:
        OutputShapeError: ``value`` is none of the three accepted shapes.
        pydantic.ValidationError: The output (or a message list) does not validate, for
            example a metric that became NaN after construction.
    """
    if value is None:
        return None
    if isinstance(value, AgentWorkflowOutput):
        output = AgentWorkflowOutput.model_validate(value)
    elif isinstance(value, list):
        output = AgentWorkflowOutput(messages=value)
    else:
        raise OutputShapeError(
            "run() must return AgentWorkflowOutput, a list of message dicts, or None "
            f"(to use the registered sample source); got {type(value).__name__}"
        )
    _check_roles(output.messages or [])
    return output


def _check_roles(messages: list[JSONObject]) -> None:
    # Framework-native items may have no role (they carry a "type"), but a role that is
    # there must be a name: trainers and trajectories key on it.
    for index, message in enumerate(messages):
        role = message.get("role", "-")
        if not isinstance(role, str) or not role:
            raise OutputShapeError(
                f"run() returned message {index} with 'role' {role!r}; a role must be a "
                "non-empty string such as 'assistant', 'user' or 'tool'"
            )
