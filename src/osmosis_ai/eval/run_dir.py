"""An eval run's directory: its manifest (the resolved-input lock), run lock and log."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import logging
import logging.handlers
import os
import queue
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from osmosis_ai import __version__
from osmosis_ai.errors import ConfigError, OsmosisError
from osmosis_ai.redact import RedactingFilter, Redactor
from osmosis_ai.rollout.ids import is_single_path_segment

__all__ = [
    "GROUP_JUDGE_FILE",
    "MANIFEST",
    "PREVIEWS_DIR",
    "RunLockedError",
    "canonical_digest",
    "check_run_name",
    "open_run_dir",
    "run_lock",
    "run_log",
    "source_digest",
]

MANIFEST = "manifest.json"
#: The group judge's verdict of one rollout, written beside its trajectory.
GROUP_JUDGE_FILE = "group_judge.json"
#: Where the rollout server publishes live previews of a run's in-flight rollouts.
PREVIEWS_DIR = "previews"
# Room for ".archive-<stamp>-<n>" and ".lock" within the usual 255-byte file name limit.
_MAX_RUN_NAME_BYTES = 200
_SKIPPED_DIRS = frozenset(
    {"__pycache__", ".git", ".venv", "venv", "dist", "build", "node_modules", ".pytest_cache",
     ".ruff_cache", ".mypy_cache", ".osmosis"}
)  # fmt: skip


class RunLockedError(OsmosisError):
    """Another process (``osmosis eval run``, ``osmosis train run``) holds this run."""


def check_run_name(name: str, *, label: str = "run name") -> str:
    """Return ``name`` if it can name a run folder directly inside the output root.

    The rule of rollout ids (one path segment, printable), plus: no leading ``.`` (the
    output root keeps its own ``.locks`` there, and hidden folders are not runs) and at
    most 200 bytes (the archive and lock files add a suffix to it).

    Raises:
        ConfigError: ``name`` breaks the rule; the message names ``label`` and the fix.
    """
    if not is_single_path_segment(name) or not name.isprintable() or name.startswith("."):
        raise ConfigError(
            f"{label} {name!r} must be a single folder name: not empty, not starting with "
            "'.', and without '/', '\\' or control characters (e.g. --name baseline-v2)"
        )
    if len(name.encode()) > _MAX_RUN_NAME_BYTES:
        raise ConfigError(
            f"{label} is {len(name.encode())} bytes long; use at most {_MAX_RUN_NAME_BYTES}"
        )
    return name


def canonical_digest(data: Any) -> str:
    """SHA-256 of the canonical JSON of ``data``."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def source_digest(root: Path) -> str:
    """SHA-256 over the sorted relative paths and bytes of a rollout's source tree.

    Caches, virtual environments, build outputs and egg-info are left out; a symlinked
    directory is refused (its contents could change without the tree changing).

    Raises:
        ConfigError: A directory inside the tree is a symlink.
    """
    digest = hashlib.sha256()
    for directory, subdirs, files in os.walk(root):
        base = Path(directory)
        for name in list(subdirs):
            if name in _SKIPPED_DIRS or name.endswith(".egg-info"):
                subdirs.remove(name)
            elif (base / name).is_symlink():
                raise ConfigError(f"{base / name} is a symlinked directory; copy it instead")
        subdirs.sort()
        for name in sorted(files):
            if name == "uv.lock" or name.endswith((".pyc", ".pyo")):
                continue
            path = base / name
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


@contextmanager
def run_lock(
    output_root: Path,
    run_name: str,
    *,
    command: str = "osmosis eval run",
    output_option: str | None = "-o",
) -> Iterator[None]:
    """Hold the exclusive lock of ``run_name`` (outside the run dir, so ``--fresh`` keeps it).

    ``command`` names the runner in the "already holds" message; ``output_option`` is the
    option that moves the output root (None: the root is fixed, so the fix is to make it
    writable).

    Raises:
        ConfigError: ``run_name`` is no valid run name, or ``output_root`` is not writable.
        RunLockedError: Another process holds it.
    """
    check_run_name(run_name)
    locks = output_root / ".locks"
    try:
        locks.mkdir(parents=True, exist_ok=True)
        fd = os.open(locks / f"{run_name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        # The first write under the output root: a read-only or misnamed -o fails here.
        fix = (
            f"pass {output_option} with a writable folder" if output_option else "make it writable"
        )
        raise ConfigError(
            f"cannot write to the output folder {output_root} ({exc.strerror}); {fix}"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunLockedError(
                f"another `{command}` already holds run {run_name!r}; wait for it to "
                "finish or pick another --name"
            ) from None
        yield
    finally:
        os.close(fd)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")


def open_run_dir(run_dir: Path, inputs: dict[str, Any], *, fresh: bool) -> dict[str, Any]:
    """Create the run directory, or reopen it for resuming; returns the manifest.

    With ``fresh``, an existing run is archived (renamed), never deleted.

    Raises:
        ConfigError: The run exists with different inputs (naming what changed).
    """
    manifest_path = run_dir / MANIFEST
    if manifest_path.exists() and fresh:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        archive = run_dir.with_name(f"{run_dir.name}.archive-{stamp}")
        suffix = 1
        while archive.exists():
            archive = run_dir.with_name(f"{run_dir.name}.archive-{stamp}-{suffix}")
            suffix += 1
        run_dir.rename(archive)
    if manifest_path.exists():
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        previous = manifest.get("inputs", {})
        changed = sorted(k for k in set(previous) | set(inputs) if previous.get(k) != inputs.get(k))
        if changed:
            raise ConfigError(
                f"run {run_dir.name!r} was started with other inputs (changed: "
                f"{', '.join(changed)}); pass --fresh to archive it and start over, or "
                "--name to start a separate run"
            )
        return manifest
    (run_dir / "rollout_trials").mkdir(parents=True, exist_ok=True)
    manifest = {
        "schema_version": 1,
        "local_run_id": uuid.uuid4().hex,
        "run_name": run_dir.name,
        "created_at": _now(),
        "inputs": inputs,
        "provenance": {"sdk_version": __version__},
    }
    from osmosis_ai.eval.files import write_json_atomic

    write_json_atomic(manifest_path, manifest)
    return manifest


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = dt.datetime.fromtimestamp(record.created, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
        step = getattr(record, "step", record.name.rsplit(".", 1)[-1])
        return f"{stamp}Z {record.levelname} [{step}] {record.getMessage()}"


@contextmanager
def run_log(path: Path, redactor: Redactor) -> Iterator[logging.Logger]:
    """A logger writing redacted lines to ``path`` (mode 0600) from a background thread."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.close(fd)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(_Formatter())
    handler.addFilter(RedactingFilter(redactor))
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(records, handler)
    logger = logging.getLogger(f"osmosis_ai.eval.run.{uuid.uuid4().hex[:8]}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    queue_handler = logging.handlers.QueueHandler(records)
    queue_handler.addFilter(RedactingFilter(redactor))  # redact before the record is queued
    logger.addHandler(queue_handler)
    listener.start()
    try:
        yield logger
    finally:
        listener.stop()
        logger.removeHandler(queue_handler)
        # Closing flushes what a full disk refused; the run reports its storage failure itself.
        with contextlib.suppress(OSError):
            handler.close()
