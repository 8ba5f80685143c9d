"""Agent-framework integrations. Import the framework's module explicitly, e.g.
``osmosis_ai.rollout.integrations.agents.strands``; this package loads no framework."""

__all__: list[str] = []
