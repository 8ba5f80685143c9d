"""AgentWorkflows as the agent loop of distributed RL engines (SkyRL, verl).

The shared core (`AgentRollouts`, `EngineTask`, `EngineRollout`, `batch_metrics`) needs
neither engine; the adapters ``osmosis_ai.train.engines.skyrl`` and
``osmosis_ai.train.engines.verl`` import theirs when imported (extras ``skyrl`` / ``verl``).
"""

from osmosis_ai.train.engines._core import AgentRollouts, EngineRollout, EngineTask, batch_metrics

__all__ = ["AgentRollouts", "EngineRollout", "EngineTask", "batch_metrics"]
