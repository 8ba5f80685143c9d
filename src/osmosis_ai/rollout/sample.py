"""The sample a rollout produces, and the output shape ``run()`` may return."""

from __future__ import annotations

import json
import logging
import math
import numbers
from decimal import Decimal
from typing import Annotated, Any, TypeGuard

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from osmosis_ai.rollout.deep_copy import deep_copy

__all__ = ["AgentWorkflowOutput", "FiniteNumber", "JSONObject", "RolloutSample", "TurnRewards"]

logger = logging.getLogger(__name__)

#: A JSON object as a Python dict (message, metadata, ...).
JSONObject = dict[str, Any]


def _is_real(value: object) -> TypeGuard[numbers.Real | Decimal]:
    return isinstance(value, numbers.Real | Decimal) and not isinstance(value, bool)


def _require_real(value: object) -> object:
    # Lax float parsing would accept "1.0" and True; rewards and metrics must be numbers.
    if not _is_real(value):
        raise ValueError(f"must be a finite number, got {type(value).__name__}")
    as_float = float(value)
    if not math.isfinite(as_float):
        raise ValueError(f"must be a finite number, got {as_float}")
    return as_float


#: A finite ``float``; booleans, strings, NaN and infinities are rejected.
FiniteNumber = Annotated[float, BeforeValidator(_require_real)]


def _require_turns(value: object) -> object:
    # JSON keys are text: "2" is turn 2, as the wire carries it; anything else is refused.
    if not isinstance(value, dict):
        return value
    turns: dict[object, object] = {}
    for key, reward in value.items():
        turn = int(key) if isinstance(key, str) and key.isdigit() else key
        if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
            raise ValueError(f"turn {key!r} must be a model call's index: an integer of at least 0")
        turns[turn] = reward
    return turns


#: Rewards of single model calls of a rollout, by the call's 0-based index.
TurnRewards = Annotated[dict[int, FiniteNumber], BeforeValidator(_require_turns)]


def _copy_messages(data: dict[str, Any]) -> list[JSONObject] | None:
    messages = data.get("messages", [])
    try:
        copied: list[JSONObject] = deep_copy(messages)
        return copied
    except Exception:  # deepcopy raises whatever the message objects raise
        logger.warning(
            "sample messages cannot be deep-copied; set RolloutSample.trajectory_messages "
            "explicitly to persist a trajectory for this sample"
        )
        return None


class RolloutSample(BaseModel):
    """The one sample a rollout produces: its message history, label and reward.

    ``messages`` keep the framework-native history that graders read. ``trajectory_messages``
    is an OpenAI chat-completions-shaped copy used only for trajectory files; it defaults to a
    deep copy of ``messages``, and an explicit ``None`` means "do not persist a trajectory".
    It never travels on the wire.
    """

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        arbitrary_types_allowed=True,
        use_attribute_docstrings=True,
    )

    messages: list[JSONObject] = Field(default_factory=list)
    """Framework-native message history; what graders and the trainer read."""

    trajectory_messages: list[JSONObject] | None = Field(default_factory=_copy_messages)
    """Chat-completions-shaped copy for ATIF persistence; ``None`` skips persistence."""

    label: str | None = None
    """Ground truth of the dataset row, if any."""

    reward: FiniteNumber | None = None
    """Reward set by the grader; ``None`` means not graded."""

    remove_sample: bool = False
    """Exclude this sample from training and scoring."""

    turn_rewards: TurnRewards = Field(default_factory=dict)
    """Optional rewards of single turns, by model call: ``{2: 0.5}`` rewards the rollout's
    third model call (in a chat-completions history, its third assistant message), e.g. for
    a tool call that succeeded. ``reward`` stays the outcome; a trainer with
    ``credit = "turn"`` gives each turn's tokens credit from the rewards from that turn on."""

    metrics: dict[str, Any] = Field(default_factory=dict)
    """Free-form numeric telemetry of the sample."""

    extra_fields: dict[str, Any] = Field(default_factory=dict)
    """Free-form extra data; keys starting ``_preview_`` are hints from preview sources."""

    def json_safe_copy(self) -> RolloutSample:
        """A copy whose ``metrics`` and ``extra_fields`` can be JSON-encoded.

        Integers and finite reals become ``int``/``float``; foreign scalars (NumPy and the
        like: anything whose ``.item()`` gives a builtin number or bool) become that builtin;
        string subclasses become ``str``; tuples become lists; non-string dict keys are
        converted like values and written as JSON writes them (``3``, ``2.5``, ``true``).
        Anything else (objects, NaN, infinities, container keys) is dropped with one warning
        naming what was dropped. ``messages`` are left as they are.
        """
        dropped: list[str] = []
        metrics = _json_safe(self.metrics, "metrics", dropped)
        extra_fields = _json_safe(self.extra_fields, "extra_fields", dropped)
        if dropped:
            logger.warning("dropped non-JSON values from sample: %s", ", ".join(dropped[:20]))
        # Always the converted copy: a value can need converting without anything dropped.
        return self.model_copy(update={"metrics": metrics, "extra_fields": extra_fields})


_DROP = object()
_SCALARS = (bool, int, float)


def _json_safe(value: Any, path: str, dropped: list[str]) -> Any:
    if value is None or type(value) in (bool, str, int):
        return value
    if isinstance(value, str):
        return str(value)
    if type(value) is float:
        if math.isfinite(value):
            return value
        dropped.append(path)
        return _DROP
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if _is_real(value):
        as_float = float(value)
        if math.isfinite(as_float):
            return as_float
        dropped.append(path)
        return _DROP
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            name = _json_key(key)
            if name is None:
                dropped.append(f"{path}[{key!r}]")
                continue
            safe = _json_safe(item, f"{path}.{name}", dropped)
            if safe is not _DROP:
                out[name] = safe
        return out
    if isinstance(value, list | tuple):
        items = (_json_safe(item, f"{path}[{i}]", dropped) for i, item in enumerate(value))
        return [item for item in items if item is not _DROP]
    scalar = _foreign_scalar(value)
    if scalar is not _DROP:
        return _json_safe(scalar, path, dropped)
    dropped.append(path)
    return _DROP


def _foreign_scalar(value: Any) -> Any:
    """``value.item()`` when it is a builtin number or bool (NumPy, PyTorch scalars)."""
    item = getattr(value, "item", None)
    if not callable(item):
        return _DROP
    try:
        scalar = item()
    except Exception:  # arrays of several elements raise; anything else is not a scalar
        return _DROP
    return scalar if type(scalar) in _SCALARS else _DROP


def _json_key(key: Any) -> str | None:
    """A dict key as JSON writes it, after converting it like a value; ``None`` to drop."""
    if isinstance(key, str):
        return str(key)
    converted = _json_safe(key, "", [])
    if type(converted) not in _SCALARS:
        return None  # containers, objects, NaN
    return json.dumps(converted)


class AgentWorkflowOutput(BaseModel):
    """What ``AgentWorkflow.run()`` may return when it builds the history itself.

    Unknown top-level fields are rejected, metrics must be finite numbers, and an instance
    is validated again when it is returned, so metrics changed in place after construction
    are still checked.
    """

    model_config = ConfigDict(
        extra="forbid",
        revalidate_instances="always",
        use_attribute_docstrings=True,
    )

    messages: list[JSONObject] | None = None
    """The sample's message history; ``None`` produces no sample."""

    metrics: dict[str, FiniteNumber] = Field(default_factory=dict)
    """Finite numeric measurements attached to the sample."""

    turn_rewards: TurnRewards = Field(default_factory=dict)
    """Rewards of single model calls, by index: the sample's ``turn_rewards``."""

    info: dict[str, Any] = Field(default_factory=dict)
    """Reserved; not passed to graders."""
