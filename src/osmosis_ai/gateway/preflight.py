"""One tiny completion before a run, so a bad key or model stops it before any dispatch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from osmosis_ai.errors import GatewayError
from osmosis_ai.gateway.policies.base import Policy
from osmosis_ai.gateway.request import parse_chat_request
from osmosis_ai.redact import redact_text

__all__ = ["PreflightResult", "preflight"]

PreflightCategory = Literal[
    "ok", "auth", "model_not_found", "bad_request", "unreachable", "rate_limited", "error"
]
_FATAL: frozenset[PreflightCategory] = frozenset(
    {"auth", "model_not_found", "bad_request", "unreachable"}
)
_BY_STATUS: dict[int, PreflightCategory] = {
    400: "bad_request",
    401: "auth",
    403: "auth",
    404: "model_not_found",
    422: "bad_request",
    429: "rate_limited",
    502: "unreachable",
    503: "unreachable",
    504: "unreachable",
}
_FIX: dict[PreflightCategory, str] = {
    "auth": "check the provider API key",
    "model_not_found": "check the model name",
    "bad_request": "check the model name and the provider's parameters",
    "unreachable": "check that the model server is running and its URL",
    "rate_limited": "the provider is rate limiting; the run goes on",
    "error": "the run goes on; calls may fail the same way",
}


@dataclass(frozen=True)
class PreflightResult:
    """How the policy answered one tiny completion."""

    category: PreflightCategory
    message: str

    @property
    def ok(self) -> bool:
        """Whether the completion succeeded."""
        return self.category == "ok"

    @property
    def fatal(self) -> bool:
        """Whether no call can succeed, so a run should stop before dispatching."""
        return self.category in _FATAL


async def preflight(policy: Policy) -> PreflightResult:
    """Ask the (started) policy for one token and classify the outcome.

    Rate limiting and unexpected errors are not fatal: the run may proceed. A rejected key,
    an unknown model, a rejected request or an unreachable server are.
    """
    request = parse_chat_request(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}
    )
    try:
        await policy.complete(request)
    except GatewayError as exc:
        category = _BY_STATUS.get(exc.status_code, "error")
        text = redact_text(str(exc), secrets=policy.secrets())
        return PreflightResult(category, f"{policy.model}: {text} ({_FIX[category]})")
    return PreflightResult("ok", f"{policy.model} answered")
