"""After a trial: scrub the rollout's key from its files, then keep logs and artifacts.

Scrubbing (`scrub_tree`, shared with the eval runner) fails closed: a file that cannot be
read and rewritten is deleted; if even that fails, the whole trial directory goes; if that
fails too, `CredentialScrubError` stops anything from being archived.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from osmosis_ai.rollout.scrub import scrub_tree

__all__ = ["keep_trial_files", "scrub_tree"]

#: Trial files kept under ``<root>/<rollout_id>/logs/``.
_LOG_ENTRIES = ("agent", "verifier", "trial.log", "exception.txt", "result.json")
#: Where Harbor mirrors the sandbox's ``/logs/artifacts`` inside the trial directory.
_ARTIFACTS = Path("artifacts", "logs", "artifacts")


def _copy_without_links(source: Path, target: Path) -> None:
    if source.is_symlink():
        return
    if source.is_dir():
        shutil.copytree(
            source,
            target,
            dirs_exist_ok=True,
            ignore=lambda d, names: [n for n in names if Path(d, n).is_symlink()],
        )
    elif source.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def keep_trial_files(trial_dir: Path, rollout_dir: Path) -> None:
    """Copy the (scrubbed) trial's logs to ``logs/`` and its artifacts to ``artifacts/``."""
    for entry in _LOG_ENTRIES:
        _copy_without_links(trial_dir / entry, rollout_dir / "logs" / entry)
    _copy_without_links(trial_dir / _ARTIFACTS, rollout_dir / "artifacts")
