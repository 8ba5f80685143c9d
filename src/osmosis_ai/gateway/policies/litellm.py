"""The LiteLLM policy: ``provider/model`` ids served through LiteLLM (imported lazily)."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import PolicyError
from osmosis_ai.gateway.policies._scrub_stream import StreamScrubber
from osmosis_ai.gateway.policies.base import Policy
from osmosis_ai.gateway.request import ChatRequest
from osmosis_ai.redact import is_credential_key
from osmosis_ai.rollout.scrub import scrub_json

__all__ = ["LiteLLMPolicy"]

# Providers whose credential variables are not (only) named after the provider id.
_EXTRA_PREFIXES = {
    "bedrock": ("AWS_",),
    "sagemaker": ("AWS_",),
    "vertex_ai": ("VERTEXAI_", "GOOGLE_"),
    "gemini": ("GOOGLE_",),
    "together_ai": ("TOGETHERAI_",),
    "huggingface": ("HF_",),
}


def _provider_key_variables(model: str, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The variables of ``environ`` holding a credential of ``model``'s provider.

    A variable counts when its name starts with the provider id (``OPENAI_`` for
    ``openai/gpt-4o-mini``; a few providers add their vendor's prefix, e.g. ``AWS_`` for
    ``bedrock``) and names a key, token, secret or password (`is_credential_key`), e.g.
    ``OPENAI_API_KEY`` or ``ANTHROPIC_AUTH_TOKEN``; ``OPENAI_BASE_URL`` does not.
    """
    provider = model.split("/", 1)[0].lower()
    prefixes = (re.sub(r"\W", "_", provider).upper() + "_", *_EXTRA_PREFIXES.get(provider, ()))
    return tuple(
        sorted(
            name
            for name, value in environ.items()
            if value and name.upper().startswith(prefixes) and is_credential_key(name)
        )
    )


def _translate(exc: Exception) -> PolicyError:
    """The one place LiteLLM's exceptions become gateway errors."""
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    message = f"{name}: {' '.join(str(getattr(exc, 'message', '') or exc).split())}"
    if "Timeout" in name or status == 408:
        return PolicyError(message, status_code=504)
    if isinstance(status, int) and 400 <= status < 500:
        return PolicyError(message, status_code=status, error_type="upstream_request_error")
    return PolicyError(message, status_code=502)


class LiteLLMPolicy(Policy):
    """Serves a LiteLLM model id (``provider/model``), e.g. ``openai/gpt-4o-mini``.

    LiteLLM is imported when the policy starts, with its model cost map read locally
    (``LITELLM_LOCAL_MODEL_COST_MAP=True``) so that importing it needs no network.
    Provider keys come from the usual environment variables or ``api_key``; both count as
    the policy's secrets (see `_provider_key_variables`), read when the policy is built.

    Args:
        model: The LiteLLM model id.
        api_key: Provider key; never shown in errors or logs.
        api_base: Provider base URL, when not the provider's default.
        timeout_sec: Timeout of one call.
    """

    kind = "litellm"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        api_base: str | None = None,
        timeout_sec: float = 600.0,
    ) -> None:
        self._model = model
        self._api_key = api_key
        self.api_base = api_base
        self.timeout_sec = timeout_sec
        self._litellm: Any = None
        names = _provider_key_variables(model, os.environ)
        self._secrets = tuple(dict.fromkeys(v for v in (api_key, *map(os.environ.get, names)) if v))

    @property
    def model(self) -> str:
        """The LiteLLM model id."""
        return self._model

    def secrets(self) -> tuple[str, ...]:
        """The key given, and the provider's keys in the environment."""
        return self._secrets

    async def start(self) -> None:
        """Import LiteLLM without letting it reach the network."""
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        self._litellm = import_optional("litellm", extra="litellm", feature="The LiteLLM policy")

    def _kwargs(self, request: ChatRequest) -> dict[str, Any]:
        kwargs = {**request.body, "model": self._model, "timeout": self.timeout_sec}
        if self._api_key:
            kwargs["api_key"] = self._api_key
        if self.api_base:
            kwargs["api_base"] = self.api_base
        return kwargs

    async def complete(self, request: ChatRequest) -> dict[str, Any]:
        """One LiteLLM completion."""
        litellm = self._require()
        try:
            response = await litellm.acompletion(**self._kwargs(request))
        except Exception as exc:
            raise _translate(exc) from exc
        answer: dict[str, Any] = scrub_json(response.model_dump(), self.secrets())
        return answer

    async def stream(self, request: ChatRequest) -> AsyncIterator[dict[str, Any]]:
        """LiteLLM's stream, chunk by chunk, ending with usage."""
        litellm = self._require()
        kwargs = {**self._kwargs(request), "stream": True}
        kwargs["stream_options"] = {"include_usage": True}
        scrubber = StreamScrubber(self.secrets())
        try:
            response = await litellm.acompletion(**kwargs)
            async for chunk in response:
                yield scrubber.feed(chunk.model_dump(exclude_none=True))
        except Exception as exc:
            raise _translate(exc) from exc
        if (rest := scrubber.flush()) is not None:
            yield rest

    def _require(self) -> Any:
        if self._litellm is None:
            raise PolicyError("the policy is not started", status_code=503)
        return self._litellm
