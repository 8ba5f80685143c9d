"""Policies: what answers the gateway's chat completions."""

from osmosis_ai.gateway.policies.base import Policy
from osmosis_ai.gateway.policies.embedded import EmbeddedPolicy
from osmosis_ai.gateway.policies.litellm import LiteLLMPolicy
from osmosis_ai.gateway.policies.openai_compatible import OpenAICompatiblePolicy
from osmosis_ai.gateway.policies.spec import (
    PolicySpec,
    build_policy,
    displayable_policy_spec,
    parse_policy_spec,
)
from osmosis_ai.gateway.policies.torch import TorchPolicy

__all__ = [
    "EmbeddedPolicy",
    "LiteLLMPolicy",
    "OpenAICompatiblePolicy",
    "Policy",
    "PolicySpec",
    "TorchPolicy",
    "build_policy",
    "displayable_policy_spec",
    "parse_policy_spec",
]
