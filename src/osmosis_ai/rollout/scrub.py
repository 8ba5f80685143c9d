"""Scrubbing known secrets out of bytes, JSON data and files, failing closed.

Only the exact secrets are replaced (by ``[REDACTED]``), raw or JSON-escaped; every other
byte stays as it was, so binary files and documents survive. A file that cannot be read and
rewritten is deleted; links, FIFOs and other special files are deleted unread (a link could
point anywhere, a FIFO would block the read).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from osmosis_ai.errors import CredentialScrubError
from osmosis_ai.redact import scrub_secrets
from osmosis_ai.rollout.storage import atomic_write_bytes

__all__ = ["scrub_bytes", "scrub_files", "scrub_json", "scrub_tree", "secret_forms"]


def secret_forms(secrets: Iterable[str]) -> tuple[str, ...]:
    """Each non-empty secret as written and as it appears inside a JSON string."""
    forms: set[str] = set()
    for secret in secrets:
        if secret:
            forms.add(secret)
            forms.add(json.dumps(secret)[1:-1])
            forms.add(json.dumps(secret, ensure_ascii=False)[1:-1])
    return tuple(sorted(forms))


def scrub_bytes(data: bytes, forms: tuple[str, ...]) -> bytes:
    """``data`` with every form replaced; the same object when none occurs.

    Bytes that are not UTF-8 go through unchanged (``surrogateescape``).
    """
    if not any(form.encode("utf-8", "surrogateescape") in data for form in forms):
        return data
    text = data.decode("utf-8", "surrogateescape")
    return scrub_secrets(text, secrets=forms).encode("utf-8", "surrogateescape")


def scrub_json(value: Any, secrets: Iterable[str]) -> Any:
    """JSON data with every secret replaced wherever it occurs; ``value`` itself when clean."""
    forms = secret_forms(secrets)
    if not forms:
        return value
    data = json.dumps(value, ensure_ascii=False).encode()
    scrubbed = scrub_bytes(data, forms)
    return value if scrubbed is data else json.loads(scrubbed)


def _scrub_file(path: Path, forms: tuple[str, ...]) -> None:
    data = path.read_bytes()
    scrubbed = scrub_bytes(data, forms)
    if scrubbed is not data:
        mode = stat.S_IMODE(path.stat().st_mode)  # a private file (0600) stays private
        atomic_write_bytes(path, scrubbed)
        path.chmod(mode)


def scrub_files(root: Path, secrets: Iterable[str]) -> list[Path]:
    """Scrub every file below ``root``; returns those that could be neither scrubbed nor deleted.

    Symlinks, FIFOs, sockets and devices are deleted; so is a file that could not be
    scrubbed. Directories are never followed through links.
    """
    forms = secret_forms(secrets)
    stuck: list[Path] = []
    if not forms or not root.is_dir() or root.is_symlink():
        return stuck
    for directory, subdirs, filenames in os.walk(root):
        # os.walk lists a link to a directory among the directories, without entering it.
        links = [name for name in subdirs if Path(directory, name).is_symlink()]
        for name in [*filenames, *links]:
            path = Path(directory, name)
            try:
                if path.is_symlink() or not path.is_file():
                    path.unlink()
                else:
                    _scrub_file(path, forms)
            except OSError:
                try:
                    path.unlink()
                except OSError:
                    stuck.append(path)
    return stuck


def scrub_tree(root: Path, secrets: list[str]) -> bool:
    """Scrub every file below ``root`` (see `scrub_files`); whether ``root`` still exists.

    When a file could be neither scrubbed nor deleted, the whole tree is deleted instead
    and ``False`` is returned.

    Raises:
        CredentialScrubError: Not even the tree could be deleted.
    """
    if not root.exists():
        return False
    if not scrub_files(root, secrets):
        return True
    shutil.rmtree(root, ignore_errors=True)
    if root.exists():
        raise CredentialScrubError(
            f"{root} holds files that could not be scrubbed of the rollout's key nor "
            "deleted; remove it by hand"
        )
    return False
