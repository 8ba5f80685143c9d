"""Strands Agents integration: ``OsmosisStrandsAgent`` and the ``OsmosisRolloutModel`` placeholder.

Construct the agent inside ``AgentWorkflow.run()``::

    agent = OsmosisStrandsAgent(
        model=OsmosisRolloutModel(params={"temperature": 1.0}),
        messages=ctx.prompt,
        callback_handler=None,
    )
    await agent.invoke_async()

The placeholder is swapped for a Strands ``OpenAIModel`` that talks to the rollout's
OpenAI-compatible endpoint with the rollout's key, and the agent registers its history as the
rollout's sample source, so ``run()`` can return ``None``. Requires the ``strands`` extra.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import AsyncGenerator, Hashable, Iterable, Mapping
from typing import Any, TypeVar

from osmosis_ai._extras import import_optional
from osmosis_ai.rollout.deep_copy import deep_copy

import_optional("strands", extra="strands", feature="The Strands integration")
import_optional("openai", extra="strands", feature="The Strands integration")

from pydantic import BaseModel  # noqa: E402
from strands import Agent  # noqa: E402
from strands.models import Model  # noqa: E402
from strands.models.openai import OpenAIModel  # noqa: E402
from strands.types.content import ContentBlock, Message, Messages  # noqa: E402
from strands.types.streaming import StreamEvent  # noqa: E402
from strands.types.tools import ToolSpec  # noqa: E402

from osmosis_ai.errors import ConfigError  # noqa: E402
from osmosis_ai.rollout.context import SampleSource, get_rollout_context  # noqa: E402
from osmosis_ai.rollout.integrations.agents._binding import (  # noqa: E402
    ROLLOUT_MODEL_NAME,
    preview_sample,
    require_rollout_context,
    rollout_client,
)
from osmosis_ai.rollout.sample import RolloutSample  # noqa: E402

__all__ = ["OsmosisRolloutModel", "OsmosisStrandsAgent", "StrandsAgentSampleSource"]

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=BaseModel)

# Keys of Strands' OpenAIModel config a placeholder may carry (model_id defaults to ours).
_MODEL_CONFIG_KEYS = frozenset({"model_id", "params", "stream", "cache_config"})
_MEDIA_KINDS = ("image", "document", "video")


class OsmosisRolloutModel(Model):
    """Placeholder for the rollout's policy model; ``OsmosisStrandsAgent`` binds it.

    Args:
        **model_config: Strands ``OpenAIModel`` settings: ``params`` (request parameters such
            as ``{"temperature": 1.0}``), ``stream`` (default ``True``; ``False`` sends
            non-streaming requests), ``model_id`` (default ``"osmosis-rollout"``; the rollout's
            endpoint decides what serves it) and ``cache_config``.

    Raises:
        ConfigError: An unknown setting (the message lists the accepted ones).
    """

    def __init__(self, **model_config: Any) -> None:
        unknown = sorted(set(model_config) - _MODEL_CONFIG_KEYS)
        if unknown:
            raise ConfigError(
                f"OsmosisRolloutModel got unknown setting(s) {', '.join(unknown)}; accepted: "
                f"{', '.join(sorted(_MODEL_CONFIG_KEYS))} (request parameters such as "
                "temperature go inside params={...})"
            )
        self.config: dict[str, Any] = {"model_id": ROLLOUT_MODEL_NAME, **model_config}

    def update_config(self, **model_config: Any) -> None:
        """Update the settings the bound model will get."""
        self.config.update(model_config)

    def get_config(self) -> dict[str, Any]:
        """The settings the bound model will get."""
        return dict(self.config)

    def bind(self, client: Any) -> OpenAIModel:
        """A Strands ``OpenAIModel`` with these settings that sends through ``client``."""
        return OpenAIModel(client=client, **copy.deepcopy(self.config))

    def structured_output(
        self,
        output_model: type[T],
        prompt: Messages,
        system_prompt: str | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[dict[str, T | Any], None]:
        raise _unbound()

    def stream(
        self,
        messages: Messages,
        tool_specs: list[ToolSpec] | None = None,
        system_prompt: str | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[StreamEvent, None]:
        raise _unbound()


def _unbound() -> RuntimeError:
    return RuntimeError(
        "OsmosisRolloutModel is a placeholder: pass it as model= to an OsmosisStrandsAgent "
        "constructed inside AgentWorkflow.run() (a plain strands.Agent does not bind it)"
    )


class OsmosisStrandsAgent(Agent):
    """A ``strands.Agent`` whose ``OsmosisRolloutModel`` is bound to the active rollout.

    With a placeholder model it must be constructed inside ``run()``; it then registers its
    history as the rollout's one sample source (a second such agent in the same rollout
    raises ``ConfigError``). Inside a rollout an agent with no model is bound the same way
    (Strands' default model would bypass the policy being trained). Any other ``model``
    passes through to Strands untouched and nothing is registered.

    ``messages`` may be the dataset row's OpenAI-style prompt (``ctx.prompt``): string
    contents become Strands text blocks, OpenAI text parts become text blocks, and system
    messages become the system prompt (after ``system_prompt=``, when both are given). The
    caller's list is never modified.

    Raises:
        RuntimeError: A placeholder model outside an active rollout context.
        ConfigError: A second sample source in this rollout, or a prompt message Strands
            cannot hold (the message names the entry).
    """

    def __init__(
        self,
        model: Model | str | None = None,
        messages: Iterable[Mapping[str, Any]] | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        converted, system_text = _strands_messages(messages)
        if system_text is not None:
            kwargs["system_prompt"] = _merge_system_prompt(kwargs.get("system_prompt"), system_text)
        if model is None and get_rollout_context() is not None:
            # Strands' default is a Bedrock model, which would bypass the policy being trained.
            model = OsmosisRolloutModel()
        if not isinstance(model, OsmosisRolloutModel):
            super().__init__(model, converted, *args, **kwargs)
            return
        rollout_ctx = require_rollout_context("OsmosisRolloutModel")
        source = StrandsAgentSampleSource(self)
        if rollout_ctx.sample_source is not None:
            rollout_ctx.set_sample_source(source)  # raises: one source per rollout
        # The source is registered only once Strands accepted the agent, so a failed
        # construction can be retried (its client is closed with the rollout's cleanups).
        super().__init__(model.bind(rollout_client(rollout_ctx)), converted, *args, **kwargs)
        rollout_ctx.set_sample_source(source)


class StrandsAgentSampleSource(SampleSource):
    """The sample of a Strands agent: its native history, plus a chat-shaped copy to persist."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    async def get_sample(self) -> RolloutSample:
        messages = deep_copy(self._agent.messages)
        return RolloutSample(
            messages=list(messages),
            trajectory_messages=_chat_messages(messages, self._agent.system_prompt),
        )

    def preview_revision(self) -> Hashable:
        history = self._agent.messages
        trimmed = getattr(self._agent.conversation_manager, "removed_message_count", 0)
        return (len(history), trimmed, id(history[-1]) if history else None)

    async def get_preview(self, max_messages: int) -> RolloutSample | None:
        if max_messages <= 0:
            return None
        history = self._agent.messages
        trimmed = getattr(self._agent.conversation_manager, "removed_message_count", 0) > 0
        recent = deep_copy(history[-max_messages:])
        truncated = trimmed or len(history) > max_messages
        system_prompt = None if truncated else self._agent.system_prompt
        return preview_sample(
            list(recent),
            _chat_messages(_without_media(recent), system_prompt, quiet=True),
            truncated=truncated,
            turn=None if trimmed else sum(1 for m in history if m["role"] == "assistant"),
        )


def _chat_messages(
    messages: Messages, system_prompt: str | None, *, quiet: bool = False
) -> list[dict[str, Any]] | None:
    """Strands history as OpenAI chat messages, or ``None`` (persist nothing) when it fails."""
    # Strands' formatter drops an empty assistant turn, but it was still a model call: the
    # trajectory would be one agent step short of the calls the gateway recorded.
    turns = [
        Message(role="assistant", content=[{"text": ""}])
        if m["role"] == "assistant" and not m["content"]
        else m
        for m in messages
    ]
    try:
        return OpenAIModel.format_request_messages(turns, system_prompt)
    except Exception as exc:
        if not quiet:
            logger.warning(
                "the Strands history could not be converted to chat messages (%s); the sample "
                "is kept but no trajectory is saved for it",
                type(exc).__name__,
            )
        return None


def _without_media(messages: Messages) -> Messages:
    """A preview-safe copy: no reasoning, media replaced by a note.

    A tool result that carried an image would become an extra user message in the final
    trajectory, so one is inserted here too and step numbers keep lining up.
    """
    out: Messages = []
    for message in messages:
        blocks: list[ContentBlock] = []
        image_results = 0
        for block in message["content"]:
            if "reasoningContent" in block:
                continue
            if "toolResult" in block:
                result = block["toolResult"]
                image_results += any("image" in b for b in result["content"])
                content = [_media_note(b) for b in result["content"]]
                blocks.append({"toolResult": {**result, "content": content}})
            else:
                blocks.append(_media_note(block))
        out.append(Message(role=message["role"], content=blocks))
        out.extend(
            Message(role="user", content=[{"text": "[image omitted from preview]"}])
            for _ in range(image_results)
        )
    return out


def _media_note(block: Any) -> Any:
    for kind in _MEDIA_KINDS:
        if kind in block:
            return {"text": f"[{kind} omitted from preview]"}
    return block


def _strands_messages(
    messages: Iterable[Mapping[str, Any]] | None,
) -> tuple[Messages | None, str | None]:
    """OpenAI-style prompt messages as Strands messages, and the system text they held."""
    if messages is None:
        return None, None
    converted: Messages = []
    system: list[str] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, Mapping):
            raise ConfigError(f"{where} must be a dict with role and content")
        role = message.get("role")
        if message.get("tool_calls") or role == "tool":
            raise ConfigError(
                f"{where}: OsmosisStrandsAgent cannot start from OpenAI tool calls or tool "
                "results; give it Strands messages (toolUse/toolResult blocks) instead"
            )
        blocks = _content_blocks(message.get("content"), where)
        if role in ("system", "developer"):
            system.extend(b["text"] for b in blocks if "text" in b)
        elif role in ("user", "assistant"):
            converted.append(Message(role=role, content=blocks))
        else:
            raise ConfigError(f"{where}.role is {role!r}; expected user, assistant or system")
    return converted, ("\n\n".join(system) if system else None)


def _content_blocks(content: object, where: str) -> list[ContentBlock]:
    if isinstance(content, str):
        return [{"text": content}]
    if not isinstance(content, list):
        raise ConfigError(f"{where}.content must be a string or a list of content parts")
    blocks: list[ContentBlock] = []
    for index, part in enumerate(content):
        if isinstance(part, Mapping) and part.get("type") == "text":
            blocks.append({"text": str(part.get("text", ""))})
        elif isinstance(part, Mapping) and "type" not in part:
            blocks.append(deep_copy(dict(part)))  # type: ignore[arg-type]
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise ConfigError(
                f"{where}.content[{index}] is a {kind!r} part, which OsmosisStrandsAgent cannot "
                "convert; pass text, or Strands content blocks (e.g. {'image': {...}})"
            )
    return blocks


def _merge_system_prompt(explicit: object, from_prompt: str) -> Any:
    if explicit is None:
        return from_prompt
    if isinstance(explicit, str):
        return f"{explicit}\n\n{from_prompt}"
    return [*explicit, {"text": from_prompt}]  # type: ignore[misc]
