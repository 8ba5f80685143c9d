"""Pydantic models of ATIF v1.7, the trajectory document format the SDK writes."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from osmosis_ai.rollout.sample import JSONObject

__all__ = [
    "Agent",
    "ContentPart",
    "FinalMetrics",
    "ImageSource",
    "Metrics",
    "Observation",
    "ObservationResult",
    "Step",
    "SubagentTrajectoryRef",
    "ToolCall",
    "Trajectory",
]

#: Schema versions a document may declare; the SDK writes the last one.
SchemaVersion = Literal[
    "ATIF-v1.0",
    "ATIF-v1.1",
    "ATIF-v1.2",
    "ATIF-v1.3",
    "ATIF-v1.4",
    "ATIF-v1.5",
    "ATIF-v1.6",
    "ATIF-v1.7",
]
#: Image MIME types an ATIF image part may declare.
ImageMediaType = Literal["image/jpeg", "image/png", "image/gif", "image/webp"]

# Fields that only an LLM (agent) step may carry.
_AGENT_ONLY_FIELDS = (
    "model_name",
    "reasoning_effort",
    "reasoning_content",
    "tool_calls",
    "metrics",
)


class _AtifModel(BaseModel):
    # A trajectory file is a contract: unknown keys and NaN/Infinity (not JSON) are errors.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True)


class ImageSource(_AtifModel):
    """Where the bytes of an image content part are."""

    media_type: ImageMediaType
    """MIME type of the image: ``image/jpeg``, ``image/png``, ``image/gif`` or ``image/webp``."""

    path: str
    """Location of the image: a file path, an URL or a ``data:`` URL."""


class ContentPart(_AtifModel):
    """One part of a multimodal message: a piece of text or an image."""

    type: Literal["text", "image"]
    """Kind of part; decides which of ``text`` and ``source`` is required."""

    text: str | None = None
    """The text of a ``text`` part."""

    source: ImageSource | None = None
    """The image of an ``image`` part."""

    @model_validator(mode="after")
    def _check_kind(self) -> ContentPart:
        # A part must carry exactly the payload its type announces, or readers misrender it.
        if self.type == "text":
            if self.text is None:
                raise ValueError("a text content part requires 'text'")
            if self.source is not None:
                raise ValueError("a text content part must not have 'source'")
        elif self.source is None:
            raise ValueError("an image content part requires 'source'")
        return self


class ToolCall(_AtifModel):
    """A tool invocation requested by the model in an agent step."""

    tool_call_id: str
    """Identifier that observation results refer to through ``source_call_id``."""

    function_name: str
    """Name of the tool or function called."""

    arguments: JSONObject
    """Arguments of the call, as a JSON object."""

    extra: JSONObject | None = None
    """Free-form additional data."""


class SubagentTrajectoryRef(_AtifModel):
    """A reference from an observation to the trajectory of a delegated subagent."""

    trajectory_id: str | None = None
    """``trajectory_id`` of the subagent trajectory (embedded or external)."""

    session_id: str | None = None
    """Session of the subagent trajectory."""

    trajectory_path: str | None = None
    """Path or URL of an external subagent trajectory document."""

    extra: JSONObject | None = None
    """Free-form additional data."""

    @model_validator(mode="after")
    def _check_target(self) -> SubagentTrajectoryRef:
        # A reference that names no trajectory cannot be followed.
        if self.trajectory_id is None and self.trajectory_path is None:
            raise ValueError(
                "a subagent trajectory reference needs trajectory_id or trajectory_path"
            )
        return self


class ObservationResult(_AtifModel):
    """The result of one tool call (or of an environment event) seen by the agent."""

    source_call_id: str | None = None
    """``tool_call_id`` of the call in the same step that produced this result."""

    content: str | list[ContentPart] | None = None
    """The result content: text, or multimodal parts."""

    subagent_trajectory_ref: list[SubagentTrajectoryRef] | None = None
    """Trajectories of subagents that produced this result."""

    extra: JSONObject | None = None
    """Free-form additional data."""


class Observation(_AtifModel):
    """What the environment returned after an agent step."""

    results: list[ObservationResult]
    """One result per tool call (or event)."""


class Metrics(_AtifModel):
    """Token usage, cost and token-level data of the LLM call(s) behind an agent step."""

    prompt_tokens: int | None = None
    """Number of prompt (input) tokens, cached ones included."""

    completion_tokens: int | None = None
    """Number of completion (output) tokens."""

    cached_tokens: int | None = None
    """Number of prompt tokens served from a cache."""

    cost_usd: float | None = None
    """Cost of the call in US dollars."""

    prompt_token_ids: list[int] | None = None
    """Token ids of the prompt."""

    completion_token_ids: list[int] | None = None
    """Token ids of the completion."""

    logprobs: list[float] | None = None
    """Log-probability of each completion token."""

    extra: JSONObject | None = None
    """Free-form additional data, such as provider ``*_tokens_details``."""


class FinalMetrics(_AtifModel):
    """Totals over the whole trajectory."""

    total_prompt_tokens: int | None = None
    """Sum of prompt tokens over all steps."""

    total_completion_tokens: int | None = None
    """Sum of completion tokens over all steps."""

    total_cached_tokens: int | None = None
    """Sum of cached prompt tokens over all steps."""

    total_cost_usd: float | None = None
    """Total cost in US dollars."""

    total_steps: int | None = Field(default=None, ge=0)
    """Number of steps in the trajectory."""

    extra: JSONObject | None = None
    """Free-form additional data."""


class Step(_AtifModel):
    """One turn of the conversation: a system, user or agent (LLM) message."""

    step_id: int = Field(ge=1)
    """Position of the step, starting at 1."""

    timestamp: str | None = None
    """When the step happened, as ISO-8601 (``Z`` accepted)."""

    source: Literal["system", "user", "agent"]
    """Who produced the step."""

    model_name: str | None = None
    """Model that produced an agent step."""

    reasoning_effort: str | float | None = None
    """Reasoning effort requested for an agent step."""

    message: str | list[ContentPart]
    """The message content: text, or multimodal parts."""

    reasoning_content: str | None = None
    """Reasoning text the model returned alongside an agent step."""

    tool_calls: list[ToolCall] | None = None
    """Tool calls requested by an agent step."""

    observation: Observation | None = None
    """Results returned by the environment for this step's tool calls."""

    metrics: Metrics | None = None
    """Usage and token-level data of an agent step."""

    is_copied_context: bool | None = None
    """Whether the step was copied from an earlier trajectory as context."""

    llm_call_count: int | None = Field(default=None, ge=0)
    """Number of LLM calls behind an agent step."""

    extra: JSONObject | None = None
    """Free-form additional data (e.g. ``original_role``)."""

    @field_validator("timestamp")
    @classmethod
    def _check_timestamp(cls, value: str | None) -> str | None:
        # Readers sort and display steps by time; an unparseable stamp breaks them.
        if value is not None:
            try:
                datetime.fromisoformat(value)
            except ValueError:
                raise ValueError(f"timestamp {value!r} is not ISO-8601") from None
        return value

    @model_validator(mode="after")
    def _check_source_rules(self) -> Step:
        # Only LLM output has a model, reasoning, tool calls or usage; anything else is a mix-up.
        if self.source != "agent":
            present = [name for name in _AGENT_ONLY_FIELDS if getattr(self, name) is not None]
            if present:
                raise ValueError(
                    f"step {self.step_id}: {', '.join(present)} only allowed on agent steps"
                )
        # A step declaring no LLM call cannot have usage or reasoning from one.
        if self.llm_call_count == 0 and (
            self.metrics is not None or self.reasoning_content is not None
        ):
            raise ValueError(
                f"step {self.step_id}: llm_call_count 0 forbids metrics and reasoning_content"
            )
        # Results must point at a call of their own step, or the linkage is meaningless.
        if self.observation is not None:
            call_ids = {call.tool_call_id for call in self.tool_calls or ()}
            for result in self.observation.results:
                if result.source_call_id is not None and result.source_call_id not in call_ids:
                    raise ValueError(
                        f"step {self.step_id}: observation source_call_id "
                        f"{result.source_call_id!r} matches no tool_call_id of the step"
                    )
        return self


class Agent(_AtifModel):
    """The agent system that produced the trajectory."""

    name: str
    """Name of the agent system."""

    version: str
    """Version of the agent system."""

    model_name: str | None = None
    """Default model of the trajectory."""

    tool_definitions: list[JSONObject] | None = None
    """Tools available to the agent, in the provider's definition format."""

    extra: JSONObject | None = None
    """Free-form additional data."""


class Trajectory(_AtifModel):
    """An ATIF trajectory document: an agent, its steps and final metrics."""

    schema_version: SchemaVersion = "ATIF-v1.7"
    """ATIF version the document follows."""

    session_id: str | None = None
    """Session the trajectory belongs to (the rollout id for SDK documents)."""

    trajectory_id: str | None = None
    """Identifier of this trajectory (the rollout id for SDK documents)."""

    agent: Agent
    """The agent that produced the trajectory."""

    steps: list[Step] = Field(min_length=1)
    """The steps, numbered 1..N in order."""

    notes: str | None = None
    """Free-form human-readable notes."""

    final_metrics: FinalMetrics | None = None
    """Totals over all steps."""

    continued_trajectory_ref: str | None = None
    """Reference to the trajectory this one continues in."""

    extra: JSONObject | None = None
    """Free-form additional data (the SDK's lives under ``extra.osmosis``)."""

    subagent_trajectories: list[Trajectory] | None = None
    """Embedded trajectories of subagents, referenced by ``trajectory_id``."""

    @model_validator(mode="after")
    def _check_document(self) -> Trajectory:
        # Readers address steps by id; gaps or reordering would point at the wrong step.
        for position, step in enumerate(self.steps, start=1):
            if step.step_id != position:
                raise ValueError(
                    f"step ids must be 1..N in order; position {position} has {step.step_id}"
                )
        # Subagent references resolve by trajectory_id, so each must exist and be unique.
        seen: set[str] = set()
        for sub in self.subagent_trajectories or ():
            if sub.trajectory_id is None:
                raise ValueError("every subagent trajectory needs a trajectory_id")
            if sub.trajectory_id in seen:
                raise ValueError(f"duplicate subagent trajectory_id {sub.trajectory_id!r}")
            seen.add(sub.trajectory_id)
        return self

    def to_json_dict(self) -> dict[str, Any]:
        """The document as JSON-ready data, with unset (``None``) fields left out."""
        return self.model_dump(mode="json", exclude_none=True)
