"""osmosis_ai: the AgentWorkflow rollout SDK.

The package root holds only the version; the public API lives at the module paths listed
in the documentation (``osmosis_ai.rollout``, ``osmosis_ai.rollout.server``, ...).
"""

__version__ = "0.1.0"
