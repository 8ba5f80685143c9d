"""Token engines: what generates completion ids and logprobs from prompt ids.

``base`` is the interface every engine implements (the seam between the gateway's chat
front and generation); ``torch`` is the continuous-batching torch loop; ``vllm`` a vLLM
server's ``/v1/completions`` from token ids, with weight reloads.
"""

from osmosis_ai.gateway.policies.engines import base
from osmosis_ai.gateway.policies.engines.base import Generation as Generation
from osmosis_ai.gateway.policies.engines.base import GenerationRequest as GenerationRequest
from osmosis_ai.gateway.policies.engines.base import Grammar as Grammar
from osmosis_ai.gateway.policies.engines.base import JsonGrammar as JsonGrammar
from osmosis_ai.gateway.policies.engines.base import LarkGrammar as LarkGrammar
from osmosis_ai.gateway.policies.engines.base import Sampling as Sampling
from osmosis_ai.gateway.policies.engines.base import TokenEngine as TokenEngine
from osmosis_ai.gateway.policies.engines.base import WeightUpdate as WeightUpdate
from osmosis_ai.gateway.policies.engines.torch import TorchEngine
from osmosis_ai.gateway.policies.engines.vllm import VllmEngine, VllmEngineError

# The interface names are listed once, in `base`; the redundant aliases above are what tells
# type checkers and linters that they are re-exported.
__all__ = [*base.__all__, "TorchEngine", "VllmEngine", "VllmEngineError"]
