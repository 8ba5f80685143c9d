"""Token engines: what generates completion ids and logprobs from prompt ids.

``base`` is the interface every engine implements (the seam between the gateway's chat
front and generation); ``torch`` is the continuous-batching torch loop; ``vllm`` a vLLM
server's ``/v1/completions`` from token ids, with weight reloads.
"""

from osmosis_ai.gateway.policies.engines.base import (
    Generation,
    GenerationRequest,
    Grammar,
    JsonGrammar,
    LarkGrammar,
    Sampling,
    TokenEngine,
    WeightUpdate,
)
from osmosis_ai.gateway.policies.engines.torch import TorchEngine
from osmosis_ai.gateway.policies.engines.vllm import VllmEngine, VllmEngineError

__all__ = [
    "LarkGrammar",
    "Generation",
    "GenerationRequest",
    "Grammar",
    "JsonGrammar",
    "Sampling",
    "TokenEngine",
    "TorchEngine",
    "VllmEngine",
    "VllmEngineError",
    "WeightUpdate",
]
