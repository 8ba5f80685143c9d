"""Validation of incoming chat-completions requests, and what the gateway refuses to forward."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from osmosis_ai.errors import ChatRequestError, ConfigError

__all__ = [
    "SAMPLING_FIELDS",
    "ChatRequest",
    "check_sampling",
    "messages_sha256",
    "parse_chat_request",
]

# Fields that would reconfigure the gateway or its provider: credentials, endpoints, routing,
# client behaviour. The gateway owns these; a workflow may not set them per call.
_DENIED_FIELDS = frozenset(
    {
        "api_key", "api_base", "base_url", "api_version", "api_type", "organization", "project",
        "custom_llm_provider", "provider", "extra_headers", "headers", "default_headers",
        "timeout", "request_timeout", "max_retries", "model_list", "deployment_id",
        "callbacks", "success_callback", "failure_callback", "input_callback", "logger_fn",
        "azure_ad_token", "azure_ad_token_provider", "client", "http_client", "mock_response",
        "proxy", "proxies", "user_api_key", "credentials", "aws_session_token",
    }
)  # fmt: skip
_DENIED_PREFIXES = (
    "_", "litellm_", "aws_", "azure_", "vertex_", "watsonx_", "sagemaker_", "oci_", "wx_", "s3_",
)  # fmt: skip

_TOOL_CHOICE_MODES = frozenset({"none", "auto", "required"})

#: Fields a gateway may impose on every call (``Gateway(sampling=...)``).
SAMPLING_FIELDS = frozenset(
    {
        "temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "stop",
        "presence_penalty", "frequency_penalty", "repetition_penalty",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated chat-completions request, as the gateway hands it to a policy."""

    body: dict[str, Any]
    """The request fields to forward (``extra_body`` merged in, ``model`` removed)."""

    requested_model: str | None
    """The ``model`` the caller named; the policy decides what actually serves it."""

    stream: bool
    """Whether the caller asked for server-sent events."""

    include_usage: bool
    """Whether the caller asked for a final usage chunk when streaming."""

    want_logprobs: bool
    """Whether the caller asked for logprobs (recorded either way when the policy gives them)."""

    want_token_ids: bool
    """Whether the caller asked for token ids (``return_token_ids``, as vLLM names it)."""

    rollout_id: str | None = None
    """The rollout the call belongs to (from the per-rollout URL), for policies that route
    a rollout's calls to one engine server (sticky sessions)."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation."""
        messages: list[dict[str, Any]] = self.body["messages"]
        return messages

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The function tools offered, possibly empty."""
        tools: list[dict[str, Any]] = self.body.get("tools") or []
        return tools


def messages_sha256(messages: list[dict[str, Any]]) -> str:
    """SHA-256 of the canonical JSON of ``messages`` (records identify prompts by it).

    Raises:
        ChatRequestError: The messages hold text that is not valid Unicode (lone surrogates).
    """
    canonical = json.dumps(messages, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    try:
        encoded = canonical.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ChatRequestError(
            "messages contain invalid Unicode (a lone surrogate escape such as \\ud800)",
            param="messages",
        ) from exc
    return hashlib.sha256(encoded).hexdigest()


def _denied(field: str) -> bool:
    return field in _DENIED_FIELDS or field.startswith(_DENIED_PREFIXES)


def _check_messages(messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError(
            "'messages' must be a non-empty list of message objects", param="messages"
        )
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ChatRequestError(
                f"messages[{index}] must be an object with a string 'role'",
                param=f"messages[{index}]",
            )


def _check_tools(tools: object, tool_choice: object) -> None:
    names: set[str] = set()
    if tools is not None:
        if not isinstance(tools, list):
            raise ChatRequestError("'tools' must be a list of function tools", param="tools")
        for index, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if not isinstance(tool, dict) or tool.get("type", "function") != "function":
                raise ChatRequestError(
                    f"tools[{index}] must be {{'type': 'function', 'function': {{...}}}}",
                    param=f"tools[{index}]",
                )
            if not isinstance(name, str) or not name:
                raise ChatRequestError(
                    f"tools[{index}].function.name must be a non-empty string",
                    param=f"tools[{index}].function.name",
                )
            names.add(name)
    if tool_choice is None or (isinstance(tool_choice, str) and tool_choice in _TOOL_CHOICE_MODES):
        return
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    chosen = function.get("name") if isinstance(function, dict) else None
    if not isinstance(chosen, str):
        raise ChatRequestError(
            "'tool_choice' must be 'none', 'auto', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
            param="tool_choice",
        )
    if chosen not in names:
        raise ChatRequestError(
            f"'tool_choice' names {chosen!r}, which is not among the offered tools",
            param="tool_choice",
        )


def _check_number(body: dict[str, Any], field: str, low: float, high: float) -> None:
    value = body.get(field)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ChatRequestError(f"'{field}' must be a finite number", param=field)
    if not low <= value <= high:
        raise ChatRequestError(f"'{field}' must be between {low:g} and {high:g}", param=field)


def _check_positive_int(body: dict[str, Any], field: str) -> None:
    value = body.get(field)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ChatRequestError(f"'{field}' must be a positive integer", param=field)


def check_sampling(sampling: Mapping[str, Any]) -> dict[str, Any]:
    """Validate sampling fields a gateway imposes on every call; return them as a dict.

    Raises:
        ConfigError: A field outside ``SAMPLING_FIELDS``, or a value a request could not
            carry either (the message names the field).
    """
    unknown = sorted(set(sampling) - SAMPLING_FIELDS)
    if unknown:
        accepted = ", ".join(sorted(SAMPLING_FIELDS))
        raise ConfigError(f"sampling cannot set {', '.join(unknown)}; it takes {accepted}")
    try:
        parse_chat_request({"messages": [{"role": "user", "content": "."}], **sampling})
    except ChatRequestError as exc:
        raise ConfigError(f"sampling: {exc}") from None
    return dict(sampling)


def parse_chat_request(
    payload: object,
    *,
    sampling: Mapping[str, Any] | None = None,
    rollout_id: str | None = None,
) -> ChatRequest:
    """Validate a decoded request body and return what the policy receives.

    ``sampling`` (checked by ``check_sampling``) replaces the request's own values: in
    training the trainer, not the agent, decides how the policy samples. ``rollout_id`` is
    the rollout the call belongs to (``ChatRequest.rollout_id``).

    Raises:
        ChatRequestError: The body is not a chat-completions request, asks for ``n`` other
            than 1, or sets a field that would reconfigure the gateway (credentials, base
            URLs, provider routing). The message names the field and the fix.
    """
    if not isinstance(payload, dict):
        raise ChatRequestError("the request body must be a JSON object")
    body = dict(payload)
    extra_body = body.pop("extra_body", None)
    if extra_body is not None:
        if not isinstance(extra_body, dict):
            raise ChatRequestError("'extra_body' must be an object", param="extra_body")
        body.update(extra_body)
    if sampling:
        if "max_tokens" in sampling:
            body.pop("max_completion_tokens", None)
        body.update(sampling)
    for field in body:
        if not isinstance(field, str) or _denied(field):
            raise ChatRequestError(
                f"field {field!r} cannot be set per request: the gateway owns credentials, "
                "base URLs and provider routing; remove it from the request",
                param=str(field),
            )
    _check_messages(body.get("messages"))
    if body.get("n", 1) != 1:
        raise ChatRequestError("only n=1 is supported; send one request per sample", param="n")
    body.pop("n", None)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ChatRequestError("'stream' must be true or false", param="stream")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise ChatRequestError("'stream_options' must be an object", param="stream_options")
    _check_tools(body.get("tools"), body.get("tool_choice"))
    _check_number(body, "temperature", 0.0, 2.0)
    _check_number(body, "top_p", 0.0, 1.0)
    _check_positive_int(body, "max_tokens")
    _check_positive_int(body, "max_completion_tokens")
    model = body.pop("model", None)
    if model is not None and not isinstance(model, str):
        raise ChatRequestError("'model' must be a string", param="model")
    return ChatRequest(
        body=body,
        requested_model=model,
        stream=stream,
        include_usage=bool(stream_options.get("include_usage")),
        want_logprobs=bool(body.get("logprobs")),
        want_token_ids=bool(body.get("return_token_ids")),
        rollout_id=rollout_id,
    )
