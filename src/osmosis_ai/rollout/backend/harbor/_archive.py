"""After a trial: scrub the rollout's key from its files, then keep logs and artifacts.

Scrubbing fails closed: a file that cannot be read and rewritten is deleted; if even that
fails, the whole trial directory goes; if that fails too, `CredentialScrubError` stops
anything from being archived.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from osmosis_ai.errors import CredentialScrubError

__all__ = ["keep_trial_files", "scrub_tree"]

_REDACTED = b"[REDACTED]"
#: Trial files kept under ``<root>/<rollout_id>/logs/``.
_LOG_ENTRIES = ("agent", "verifier", "trial.log", "exception.txt", "result.json")
#: Where Harbor mirrors the sandbox's ``/logs/artifacts`` inside the trial directory.
_ARTIFACTS = Path("artifacts", "logs", "artifacts")


def _scrub_file(path: Path, secrets: list[bytes]) -> None:
    data = path.read_bytes()
    if any(secret in data for secret in secrets):
        for secret in secrets:
            data = data.replace(secret, _REDACTED)
        path.write_bytes(data)


def scrub_tree(root: Path, secrets: list[str]) -> bool:
    """Replace every secret in every file below ``root``; whether ``root`` still exists.

    Symlinks, FIFOs and sockets are removed. Returns ``False`` when the tree had
    to be deleted because a file could be neither scrubbed nor deleted.

    Raises:
        CredentialScrubError: Not even the tree could be deleted.
    """
    needles = [s.encode() for s in secrets if s]
    if not needles or not root.exists():
        return root.exists()
    stuck = False
    for directory, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(directory, name)
            try:
                if path.is_symlink() or not path.is_file():
                    path.unlink()  # links could point anywhere; a FIFO would block a read
                else:
                    _scrub_file(path, needles)
            except OSError:
                try:
                    path.unlink()
                except OSError:
                    stuck = True
    if not stuck:
        return True
    shutil.rmtree(root, ignore_errors=True)
    if root.exists():
        raise CredentialScrubError(
            f"{root} holds files that could not be scrubbed of the rollout's key nor "
            "deleted; remove it by hand"
        )
    return False


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
