"""The files of a training run's directory (``.osmosis/train/<run>/``), named once.

The trainer writes them, the viewer and ``osmosis train export`` read them; each name here is
the only place it is spelled.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RUN_FILES", "RunFiles"]


@dataclass(frozen=True)
class RunFiles:
    """The names, relative to the run directory."""

    config: str = "config.toml"
    """The resolved config the run trains with (recipe, file, ``--set`` flags)."""
    events: str = "events.jsonl"
    """The journal: ``start``, ``step``, ``eval``, ``checkpoint``, ``resume``, ``stopped``."""
    metrics: str = "metrics.jsonl"
    """One line per applied step."""
    logs: str = "logs.txt"
    """The run's log, redacted (the rollout server's output too)."""
    checkpoints: str = "checkpoints"
    """``step-NNNN/`` directories: weights or adapter, tokenizer, ``trainer.pt``."""
    rollouts: str = "rollouts"
    """Each rollout's artifacts, by rollout id."""
    rollout_lines: str = "rollouts.jsonl"
    """One line per finished rollout: status, reward, tokens, error."""
    sequences: str = "sequences"
    """``step-NNNN.jsonl``: the training sequences of the first steps (``record_sequences``)."""


RUN_FILES = RunFiles()
