"""Policy specifications as written on command lines and in eval configs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.policies.base import Policy
from osmosis_ai.gateway.policies.embedded import EmbeddedPolicy
from osmosis_ai.gateway.policies.litellm import LiteLLMPolicy
from osmosis_ai.gateway.policies.openai_compatible import OpenAICompatiblePolicy, split_userinfo
from osmosis_ai.gateway.policies.torch import TorchPolicy
from osmosis_ai.redact import REDACTED

__all__ = ["PolicySpec", "build_policy", "displayable_policy_spec", "parse_policy_spec"]

_OPENAI_PREFIXES = ("openai-compatible:", "openai:")
_PORT_AND_PATH = re.compile(r"\d+(/.*)?")
_LITELLM_ID = re.compile(r"[A-Za-z0-9_.-]+/\S+")


@dataclass(frozen=True)
class PolicySpec:
    """A parsed policy specification."""

    kind: Literal["embedded", "openai", "litellm", "torch"]
    base_url: str | None = None
    model: str | None = None
    """The model name, or the checkpoint directory of a ``torch`` policy."""


def displayable_policy_spec(spec: str) -> str:
    """``spec`` as it may be shown or stored: credentials in a URL become ``[REDACTED]``.

    ``openai:http://user:pw@host/v1:m`` is shown as ``openai:http://[REDACTED]@host/v1:m``;
    every other specification is returned as written.
    """
    for prefix in _OPENAI_PREFIXES:
        if spec.strip().startswith(prefix):
            scheme, userinfo, rest = split_userinfo(spec.strip()[len(prefix) :])
            if userinfo:
                return f"{prefix}{scheme}{REDACTED}@{rest}"
    return spec


def parse_policy_spec(spec: str) -> PolicySpec:
    """Parse ``embedded``, ``openai:<base_url>[:<model>]`` (also ``openai-compatible:``),
    ``litellm:<provider/model>``, a bare LiteLLM id ``<provider>/<model>``, or
    ``torch:<dir>`` (a checkpoint directory written by ``save_pretrained``).

    In ``openai:http://host:8000/v1:Qwen/Qwen3-8B`` the text after the last ``:`` is the
    model, unless it is a port (digits, optionally followed by a path) or inside the URL's
    credentials (``http://user:password@host``). Error messages show `displayable_policy_spec`.

    Raises:
        ConfigError: The specification matches none of these forms.
    """
    text = spec.strip()
    if text in ("", "embedded"):
        return PolicySpec("embedded")
    if text.startswith("torch:"):
        directory = text.removeprefix("torch:").strip()
        if not directory:
            raise ConfigError(
                f"policy {spec!r}: name the checkpoint directory, e.g. torch:./checkpoints/step-40"
            )
        return PolicySpec("torch", model=directory)
    for prefix in _OPENAI_PREFIXES:
        if text.startswith(prefix):
            rest = text[len(prefix) :]
            base_url, model = rest, None
            scheme, userinfo, after = split_userinfo(rest)
            head, sep, tail = after.rpartition(":")
            if sep and scheme and head and not _PORT_AND_PATH.fullmatch(tail):
                credentials = "" if userinfo is None else userinfo + "@"
                base_url, model = scheme + credentials + head, tail or None
            if not re.match(r"https?://[^/]", base_url):
                raise ConfigError(
                    f"policy {displayable_policy_spec(spec)!r}: the base URL must start with "
                    "http:// or https://, e.g. openai:http://127.0.0.1:8000/v1"
                )
            return PolicySpec("openai", base_url=base_url, model=model)
    model = text.removeprefix("litellm:")
    if _LITELLM_ID.fullmatch(model):
        return PolicySpec("litellm", model=model)
    raise ConfigError(
        f"policy {displayable_policy_spec(spec)!r} is not recognised; use 'embedded', "
        "'openai:<base_url>[:<model>]', 'torch:<checkpoint dir>' or a LiteLLM id such as "
        "'openai/gpt-4o-mini'"
    )


def build_policy(
    spec: str | PolicySpec, *, api_key: str | None = None, timeout_sec: float | None = None
) -> Policy:
    """Construct the policy a specification names (not started).

    ``timeout_sec`` bounds one upstream call of an openai or LiteLLM policy (``None``:
    600 s); the embedded and torch models have no upstream.

    Raises:
        ConfigError: The specification is not recognised, its URL carries credentials
            and ``api_key`` is given too, or a torch checkpoint directory lacks its config,
            weights or tokenizer.
    """
    parsed = parse_policy_spec(spec) if isinstance(spec, str) else spec
    if parsed.kind == "embedded":
        return EmbeddedPolicy()
    if parsed.kind == "torch":
        assert parsed.model is not None
        return TorchPolicy(Path(parsed.model).expanduser())
    timeout = 600.0 if timeout_sec is None else timeout_sec
    if parsed.kind == "openai":
        assert parsed.base_url is not None
        return OpenAICompatiblePolicy(
            parsed.base_url, model=parsed.model, api_key=api_key, timeout_sec=timeout
        )
    assert parsed.model is not None
    return LiteLLMPolicy(parsed.model, api_key=api_key, timeout_sec=timeout)
