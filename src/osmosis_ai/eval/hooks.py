"""What a front end (the CLI, a test, the train runner) hears from an eval run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from osmosis_ai.eval.journal import JournalRecord

__all__ = ["EvalHooks", "ItemProgress", "QuietHooks"]


@dataclass(frozen=True)
class ItemProgress:
    """Where a run stands after one more finished item."""

    done: int
    """Items finished, those resumed from earlier runs included."""
    total: int
    """All work items of the run."""
    passed: int
    """Items of this invocation that pass (the config's ``pass_threshold``, see `passes`)."""
    failed: int
    """Items of this invocation that failed."""


class EvalHooks(Protocol):
    """Called by `run_eval` as the run goes; none of them may block the event loop.

    Every text they get is already redacted of the run's keys.
    """

    async def run_dir_ready(self, run_dir: Path) -> None:
        """The run directory exists; nothing is dispatched yet (``--view`` serves it)."""

    def plan(self, plan: Mapping[str, str]) -> None:
        """What the run is about to do, as label -> value lines."""

    def message(self, text: str) -> None:
        """One step of the run ("starting rollout server ...")."""

    def item_finished(self, record: JournalRecord, progress: ItemProgress) -> None:
        """``record`` is durably journaled; ``progress`` counts it."""


class QuietHooks:
    """Hooks that ignore everything: the default, and a base to override a few."""

    async def run_dir_ready(self, run_dir: Path) -> None:
        del run_dir

    def plan(self, plan: Mapping[str, str]) -> None:
        del plan

    def message(self, text: str) -> None:
        del text

    def item_finished(self, record: JournalRecord, progress: ItemProgress) -> None:
        del record, progress
