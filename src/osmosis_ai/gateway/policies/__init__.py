"""Policies: what answers the gateway's chat completions.

``EnginePolicy`` is a ``ChatFront`` (``chat_front.py``) on a token engine (``engines/``);
``TorchPolicy`` is one on the torch engine. The others answer chat with a model server.
"""

from osmosis_ai.gateway.policies.base import Policy
from osmosis_ai.gateway.policies.chat_front import ChatFront
from osmosis_ai.gateway.policies.embedded import EmbeddedPolicy
from osmosis_ai.gateway.policies.engine_policy import EnginePolicy
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
    "ChatFront",
    "EmbeddedPolicy",
    "EnginePolicy",
    "LiteLLMPolicy",
    "OpenAICompatiblePolicy",
    "Policy",
    "PolicySpec",
    "TorchPolicy",
    "build_policy",
    "displayable_policy_spec",
    "parse_policy_spec",
]
