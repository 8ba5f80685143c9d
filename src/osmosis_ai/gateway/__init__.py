"""The model gateway: the controller's rollout-scoped OpenAI-compatible endpoint.

Every LLM call of a rollout reaches ``<base>/v1/rollouts/<rollout_id>/chat/completions``;
the gateway forwards it to a policy (the embedded model, an OpenAI-compatible server, a
LiteLLM provider, or live torch weights) and records usage, token ids and logprobs per call.
"""

from osmosis_ai.gateway.app import create_gateway_app
from osmosis_ai.gateway.judge import Judge, JudgeUsage
from osmosis_ai.gateway.policies import (
    EmbeddedPolicy,
    LiteLLMPolicy,
    OpenAICompatiblePolicy,
    Policy,
    PolicySpec,
    TorchPolicy,
    build_policy,
    displayable_policy_spec,
    parse_policy_spec,
)
from osmosis_ai.gateway.preflight import PreflightResult, preflight
from osmosis_ai.gateway.records import CallRecord, CallRecords
from osmosis_ai.gateway.request import ChatRequest
from osmosis_ai.gateway.server import Gateway

__all__ = [
    "CallRecord",
    "CallRecords",
    "ChatRequest",
    "EmbeddedPolicy",
    "Gateway",
    "Judge",
    "JudgeUsage",
    "LiteLLMPolicy",
    "OpenAICompatiblePolicy",
    "Policy",
    "PolicySpec",
    "PreflightResult",
    "TorchPolicy",
    "build_policy",
    "displayable_policy_spec",
    "create_gateway_app",
    "parse_policy_spec",
    "preflight",
]
