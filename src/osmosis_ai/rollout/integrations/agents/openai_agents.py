"""OpenAI Agents SDK integration: ``OsmosisAgent``, ``OsmosisRolloutModel`` and a session.

Construct both inside ``AgentWorkflow.run()``::

    agent = OsmosisAgent(
        name="assistant",
        instructions="Answer the user's request clearly.",
        model=OsmosisRolloutModel(),
        model_settings=ModelSettings(temperature=1.0),
    )
    session = OsmosisMemorySession()
    await Runner.run(agent, ctx.prompt, session=session)

The placeholder becomes the SDK's own ``OpenAIResponsesModel`` on the rollout's endpoint (the
gateway serves the Responses API), or its ``OpenAIChatCompletionsModel`` with
``OsmosisRolloutModel(api="chat_completions")``; ``Runner.run`` and ``Runner.run_streamed``
both work. The session registers the conversation as the rollout's sample source, so ``run()``
can return ``None``.

The SDK's default trace export (to OpenAI's servers) is switched off the first time an agent is
bound to a rollout: prompts of a training run should not leave the machine unasked. Opt in by
setting ``OPENAI_AGENTS_DISABLE_TRACING=false`` in the environment, which is then respected.
Requires the ``openai-agents`` extra.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator, Hashable, Iterable
from typing import Any, Generic, Literal

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout.deep_copy import deep_copy

import_optional("agents", extra="openai-agents", feature="The OpenAI Agents integration")

from agents import Agent, set_tracing_disabled  # noqa: E402
from agents.memory.session import SessionABC  # noqa: E402
from agents.models.chatcmpl_converter import Converter  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel  # noqa: E402
from agents.models.openai_responses import OpenAIResponsesModel  # noqa: E402
from agents.run_context import TContext  # noqa: E402

from osmosis_ai.rollout.context import RolloutContext, SampleSource, get_rollout_context  # noqa: E402
from osmosis_ai.rollout.integrations.agents._binding import (  # noqa: E402
    ROLLOUT_MODEL_NAME,
    preview_sample,
    require_rollout_context,
    rollout_client,
)
from osmosis_ai.rollout.sample import RolloutSample  # noqa: E402

__all__ = [
    "ModelApi",
    "OsmosisAgent",
    "OsmosisMemorySession",
    "OsmosisRolloutModel",
    "SessionSampleSource",
]

logger = logging.getLogger(__name__)

_TRACING_ENV = "OPENAI_AGENTS_DISABLE_TRACING"
_tracing_decided = False

#: How the bound model calls the rollout's endpoint: the SDK's default Responses API, or
#: chat completions.
ModelApi = Literal["responses", "chat_completions"]


class OsmosisRolloutModel(Model):
    """Placeholder for the rollout's policy model; ``OsmosisAgent`` binds it.

    Sampling parameters belong in the agent's ``ModelSettings``.

    Args:
        api: ``responses`` (the SDK's default model, ``OpenAIResponsesModel``) or
            ``chat_completions`` (``OpenAIChatCompletionsModel``). Both are served by the
            rollout's gateway and recorded alike.

    Raises:
        ConfigError: Another ``api``.
    """

    def __init__(self, api: ModelApi = "responses") -> None:
        if api not in ("responses", "chat_completions"):
            raise ConfigError(f"api must be 'responses' or 'chat_completions', not {api!r}")
        self.api: ModelApi = api

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        raise _unbound()

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise _unbound()


def _unbound() -> RuntimeError:
    return RuntimeError(
        "OsmosisRolloutModel is a placeholder: pass it as model= to an OsmosisAgent constructed "
        "inside AgentWorkflow.run() (a plain agents.Agent does not bind it)"
    )


class OsmosisAgent(Agent[TContext], Generic[TContext]):
    """An ``agents.Agent`` whose model is bound to the active rollout.

    ``model=OsmosisRolloutModel()`` requires an active rollout context. Inside a rollout an
    agent with no model is bound the same way (the SDK's default would call OpenAI directly,
    bypassing the policy being trained); any other model passes through untouched. Several
    agents (handoffs, agents as tools) may share one rollout: the sample comes from the
    ``OsmosisMemorySession`` given to ``Runner.run``.

    Raises:
        RuntimeError: A placeholder model outside an active rollout context.
    """

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[no-untyped-call]
        placeholder = isinstance(self.model, OsmosisRolloutModel)
        if placeholder or (self.model is None and get_rollout_context() is not None):
            rollout_ctx = require_rollout_context("OsmosisRolloutModel")
            api = self.model.api if isinstance(self.model, OsmosisRolloutModel) else "responses"
            bound = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
            self.model = bound(model=ROLLOUT_MODEL_NAME, openai_client=rollout_client(rollout_ctx))
            _disable_default_trace_export()


def _disable_default_trace_export() -> None:
    global _tracing_decided
    if _tracing_decided:
        return
    _tracing_decided = True
    if _TRACING_ENV in os.environ:
        return  # the user decided; their value is what the SDK reads
    set_tracing_disabled(True)
    logger.info(
        "OpenAI Agents SDK tracing disabled for rollouts (set %s=false to keep it)", _TRACING_ENV
    )


class OsmosisMemorySession(SessionABC):
    """An in-memory session that records the conversation as the rollout's sample.

    Created inside ``run()`` it registers itself as the rollout's one sample source and
    refuses to be used by a different rollout later (create one per ``run()``). Created
    outside any rollout it is a plain in-memory session as long as it stays outside: used
    inside a rollout it raises, since that rollout would get no sample from it.

    Attributes:
        items: The conversation, in the SDK's Responses-API item shape.

    Raises:
        ConfigError: This rollout already has a sample source.
        RuntimeError: (on use) The session was created outside the active rollout.
    """

    def __init__(self, session_id: str | None = None) -> None:
        self.session_id = session_id or uuid.uuid4().hex
        self.items: list[Any] = []
        self._rollout_ctx: RolloutContext | None = get_rollout_context()
        if self._rollout_ctx is not None:
            self._rollout_ctx.set_sample_source(SessionSampleSource(self))

    def _check_rollout(self) -> None:
        active = get_rollout_context()
        if active is None or active is self._rollout_ctx:
            return
        # Recording silently into a session the rollout does not know would leave the
        # rollout without a sample; refuse before any model call is spent.
        owner = (
            "was created outside any rollout"
            if self._rollout_ctx is None
            else f"belongs to rollout {self._rollout_ctx.rollout_id!r}"
        )
        raise RuntimeError(
            f"this OsmosisMemorySession {owner} and cannot record rollout "
            f"{active.rollout_id!r}: the session must be created inside the rollout "
            "(construct a new OsmosisMemorySession inside each AgentWorkflow.run())"
        )

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The latest ``limit`` items (all when ``None``), oldest first."""
        self._check_rollout()
        return _latest(self.items, limit)

    async def add_items(self, items: list[Any]) -> None:
        """Append items to the conversation."""
        self._check_rollout()
        self.items.extend(items)

    async def pop_item(self) -> Any | None:
        """Remove and return the newest item, or ``None`` when empty."""
        self._check_rollout()
        return self.items.pop() if self.items else None

    async def clear_session(self) -> None:
        """Forget every item."""
        self._check_rollout()
        self.items.clear()


def _latest(items: list[Any], limit: int | None) -> list[Any]:
    if limit is None:
        return list(items)
    return list(items[-limit:]) if limit > 0 else []


class SessionSampleSource(SampleSource):
    """The sample of an OpenAI Agents session: native items, plus a chat-shaped copy to persist.

    ``messages`` keep the SDK's item shape (the conversion to chat messages is lossy and fails
    on some hosted-tool items); ``trajectory_messages`` is that conversion, or ``None`` with a
    warning when it fails, in which case no trajectory is saved but the sample is kept.
    """

    def __init__(self, session: SessionABC) -> None:
        self._session = session

    async def get_sample(self) -> RolloutSample:
        items = deep_copy(await self._session.get_items())
        return RolloutSample(messages=items, trajectory_messages=_chat_messages(items))

    def preview_revision(self) -> Hashable | None:
        session = self._session
        if not isinstance(session, OsmosisMemorySession):
            return None  # another session's items may live elsewhere: ask every time
        return (len(session.items), id(session.items[-1]) if session.items else None)

    async def get_preview(self, max_messages: int) -> RolloutSample | None:
        if max_messages <= 0:
            return None
        window = await self._session.get_items(limit=max_messages + 1)
        recent = deep_copy(window[-max_messages:])
        # Turns need the whole history, which only our own session exposes cheaply.
        session = self._session
        turn = _model_turns(session.items) if isinstance(session, OsmosisMemorySession) else None
        return preview_sample(
            recent,
            _chat_messages(recent, quiet=True),
            truncated=len(window) > max_messages,
            turn=turn,
        )


def _chat_messages(items: list[Any], *, quiet: bool = False) -> list[dict[str, Any]] | None:
    try:
        messages = Converter.items_to_messages(items, preserve_tool_output_all_content=True)
        return [dict(message) for message in messages]
    except Exception as exc:
        if not quiet:
            logger.warning(
                "the session items could not be converted to chat messages (%s); the sample is "
                "kept but no trajectory is saved for it",
                type(exc).__name__,
            )
        return None


_INPUT_ROLES = frozenset({"user", "system", "developer"})


def _model_turns(items: Iterable[Any]) -> int | None:
    """How many model responses the items hold: runs of output items between input items."""
    turns = 0
    in_output = False
    for item in items:
        if not isinstance(item, dict):
            return None
        kind = str(item.get("type", "message"))
        role = item.get("role")
        output = kind == "reasoning" or kind.endswith("_call")
        if output or (kind == "message" and role == "assistant"):
            turns += not in_output
            in_output = True
        elif (kind == "message" and role in _INPUT_ROLES) or kind.endswith("_call_output"):
            in_output = False
        else:
            return None
    return turns
