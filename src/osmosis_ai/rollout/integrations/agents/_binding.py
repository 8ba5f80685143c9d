"""What the agent integrations share: binding to the active rollout and preview samples."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from osmosis_ai.rollout.context import RolloutContext, get_rollout_context
from osmosis_ai.rollout.model_pool import tls_context
from osmosis_ai.rollout.sample import RolloutSample

if TYPE_CHECKING:
    import openai

__all__ = ["ROLLOUT_MODEL_NAME", "preview_sample", "require_rollout_context", "rollout_client"]

#: The ``model`` integrations send; the rollout's endpoint decides what actually serves it.
ROLLOUT_MODEL_NAME = "osmosis-rollout"

# The openai client refuses to start without a key; a gateway that wants none ignores this.
_NO_KEY = "osmosis-no-key"


def require_rollout_context(placeholder: str) -> RolloutContext:
    """The active rollout context, which a placeholder model needs to be bound.

    Raises:
        RuntimeError: No rollout is active here, or its context has no model endpoint.
    """
    rollout_ctx = get_rollout_context()
    if rollout_ctx is None:
        raise RuntimeError(
            f"{placeholder} requires an active RolloutContext: construct the agent inside "
            "AgentWorkflow.run(), where the execution backend installs one (at import time or "
            "in __init__ there is no rollout to bind to)"
        )
    if not rollout_ctx.chat_completions_url:
        raise RuntimeError(
            f"{placeholder}: the active RolloutContext has no chat_completions_url; the backend "
            "that runs this workflow must set it (or set OSMOSIS_CHAT_COMPLETIONS_URL)"
        )
    return rollout_ctx


def rollout_client(rollout_ctx: RolloutContext) -> openai.AsyncOpenAI:
    """An ``openai.AsyncOpenAI`` for the rollout's endpoint, closed when the rollout ends.

    One client per agent serves all of the agent's calls (a fresh client per call, as
    Strands makes by default, costs a TLS context and a connection each). It sends through
    the host's `ModelConnectionPool` when the context has one, so rollouts reuse each
    other's connections; otherwise through a pool of its own. Either way every client
    shares one TLS context, so binding an agent costs well under a millisecond.

    It never retries (the ``openai`` SDK's default is twice): the endpoint is the rollout's
    own, and under training a retried call is a second sample of the same prompt that the
    agent never sees, so its tokens would train as if it had. A failed call fails the way
    the framework reports errors.
    """
    import openai

    pool = rollout_ctx.model_pool
    http_client = (
        openai.DefaultAsyncHttpxClient(transport=pool.transport())
        if pool is not None
        else openai.DefaultAsyncHttpxClient(verify=tls_context())
    )
    client = openai.AsyncOpenAI(
        base_url=rollout_ctx.chat_completions_url,
        api_key=rollout_ctx.api_key or _NO_KEY,
        http_client=http_client,
        max_retries=0,
    )
    rollout_ctx.add_cleanup(client.close)
    return client


def preview_sample(
    messages: list[Any],
    trajectory_messages: list[dict[str, Any]] | None,
    *,
    truncated: bool,
    turn: int | None,
) -> RolloutSample:
    """A preview snapshot with the hints the preview collector reads.

    ``truncated`` says the window is not the whole history (so step numbers may not match
    the final trajectory); ``turn`` is how many model responses the rollout has had so far,
    ``None`` when unknown.
    """
    return RolloutSample(
        messages=messages,
        trajectory_messages=trajectory_messages,
        extra_fields={"_preview_truncated": truncated, "_preview_turn": turn},
    )
