"""Agent integrations: ``.strands`` (Strands Agents) and ``.openai_agents`` (OpenAI Agents SDK).

Each module imports its framework, so import only the one you use.
"""

__all__: list[str] = []
