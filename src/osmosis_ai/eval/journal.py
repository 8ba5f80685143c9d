"""The crash-safe journal of an eval run (``events.jsonl``), the authority for resuming it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final, Literal, get_args

from osmosis_ai._context_exit import UnconditionalExit
from osmosis_ai.errors import ConfigError, OsmosisError
from osmosis_ai.rollout.ids import ensure_single_path_segment
from osmosis_ai.rollout.sample import JSONObject

__all__ = [
    "Journal",
    "JournalCorruptError",
    "JournalRecord",
    "JournalStatus",
    "STORAGE_ERROR",
    "WorkItem",
    "pending_items",
    "read_records",
]

#: Terminal status of one work item as the journal records it.
JournalStatus = Literal["success", "failed", "skipped"]

#: A work item: ``(row_index, run_index)``.
WorkItem = tuple[int, int]

#: ``error_type`` of an item whose outputs could not be stored (disk full, read-only...).
#: Such a record says why the item is not done; it is not a result, so resume redoes it.
STORAGE_ERROR: Final = "storage_error"

_STATUSES: Final[frozenset[str]] = frozenset(get_args(JournalStatus))
_REQUIRED_KEYS: Final = frozenset({"row_index", "run_index", "rollout_id", "status"})
_OPTIONAL_KEYS: Final = frozenset(
    {"source_row_index", "reward", "tokens", "duration_ms", "error_type", "error_message"}
)
_FILE_MODE: Final = 0o600


class JournalCorruptError(OsmosisError):
    """A committed (newline-terminated) journal line is not a valid record.

    A crash can only leave a partial *last* line, which replay discards; a bad complete line
    means the file was edited or damaged, so the run state cannot be trusted.

    Attributes:
        path: The journal file.
        line_number: 1-based number of the offending line.
    """

    category = "internal_error"

    def __init__(self, path: Path, line_number: int, reason: str) -> None:
        self.path = path
        self.line_number = line_number
        super().__init__(
            f"journal {str(path)!r} line {line_number} is not a valid record ({reason}); "
            "the run state is corrupt: restore the file or start over with --fresh"
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """The durable outcome of one work item ``(row_index, run_index)``.

    Fields are validated on construction, so every record that exists can be written and
    read back. Integer ``reward`` and ``duration_ms`` values are stored as floats.

    Attributes:
        row_index: Position of the row within the selected rows (0-based).
        run_index: Which of the ``n`` runs of that row (0-based).
        rollout_id: Id of the rollout that produced this outcome; a single path segment.
        status: ``success``, ``failed`` or ``skipped``.
        source_row_index: Offset of the row in the dataset file, when known.
        reward: Finite reward, when the rollout was graded.
        tokens: Tokens used by the rollout, when counted.
        duration_ms: Wall time of the rollout in milliseconds, when measured.
        error_type: Short failure category (``rollout_protocol_error``...), when failed.
        error_message: What went wrong and how to fix it, when known.

    Raises:
        ConfigError: A field has the wrong type or an out-of-range value.
        InvalidIdError: ``rollout_id`` is not a single path segment.
    """

    row_index: int
    run_index: int
    rollout_id: str
    status: JournalStatus
    source_row_index: int | None = None
    reward: float | None = None
    tokens: int | None = None
    duration_ms: float | None = None
    error_type: str | None = None
    error_message: str | None = None

    _FIELDS: ClassVar[tuple[str, ...]] = (
        "row_index",
        "run_index",
        "rollout_id",
        "status",
        "source_row_index",
        "reward",
        "tokens",
        "duration_ms",
        "error_type",
        "error_message",
    )

    def __post_init__(self) -> None:
        for name in ("row_index", "run_index"):
            _check_index(name, getattr(self, name), optional=False)
        _check_index("source_row_index", self.source_row_index, optional=True)
        ensure_single_path_segment(self.rollout_id, label="rollout_id")
        if self.status not in _STATUSES:
            raise ConfigError(
                f"journal status {self.status!r} is invalid: use 'success', 'failed' or 'skipped'"
            )
        if self.tokens is not None and (not _is_int(self.tokens) or self.tokens < 0):
            raise ConfigError(f"tokens {self.tokens!r} must be a non-negative integer or None")
        for name in ("reward", "duration_ms"):
            value = getattr(self, name)
            if value is None:
                continue
            if not _is_number(value) or not math.isfinite(value):
                raise ConfigError(f"{name} {value!r} must be a finite number or None")
            if name == "duration_ms" and value < 0:
                raise ConfigError(f"duration_ms {value!r} must not be negative")
            # One representation on disk and in memory: 1 and 1.0 are the same reward.
            object.__setattr__(self, name, float(value))
        for name in ("error_type", "error_message"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{name} {value!r} must be a non-empty string or None")

    @property
    def key(self) -> WorkItem:
        """The work item this record settles: ``(row_index, run_index)``."""
        return (self.row_index, self.run_index)

    def to_json(self) -> JSONObject:
        """The record as a JSON object with ``None`` fields omitted.

        Returns:
            A new dict in field order; canonical key order is applied by `encode`.
        """
        return {
            name: getattr(self, name) for name in self._FIELDS if getattr(self, name) is not None
        }

    def encode(self) -> bytes:
        """The canonical journal line: sorted keys, nulls omitted, compact, newline-terminated.

        Returns:
            UTF-8 bytes ending in ``b"\\n"``.
        """
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), allow_nan=False)
        return (text + "\n").encode("utf-8")

    @classmethod
    def from_json(cls, data: object) -> JournalRecord:
        """Build a record from a decoded journal line.

        Args:
            data: The decoded JSON value.

        Returns:
            The validated record.

        Raises:
            ConfigError: ``data`` is not an object, misses a required key, has an unknown
                key, or holds an invalid value.
        """
        if not isinstance(data, Mapping):
            raise ConfigError("a journal record must be a JSON object")
        missing = sorted(_REQUIRED_KEYS - data.keys())
        if missing:
            raise ConfigError(f"missing required key(s): {', '.join(missing)}")
        unknown = sorted(set(data.keys()) - _REQUIRED_KEYS - _OPTIONAL_KEYS)
        if unknown:
            raise ConfigError(f"unknown key(s): {', '.join(map(str, unknown))}")
        # Canonical lines omit nulls; an explicit null still reads as "absent".
        return cls(**{str(name): value for name, value in data.items()})


def _check_index(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{name} {value!r} must be a non-negative integer")


def _reject_constant(token: str) -> Any:
    # The encoder refuses NaN and infinities, so a line holding one was not written by us.
    raise ValueError(f"non-finite number {token}")


def _unique_object(pairs: list[tuple[str, Any]]) -> JSONObject:
    result: JSONObject = {}
    for name, value in pairs:
        if name in result:
            raise ValueError(f"duplicate key {name!r}")
        result[name] = value
    return result


def _decode_line(line: bytes) -> JournalRecord:
    data = json.loads(
        line.decode("utf-8"),
        parse_constant=_reject_constant,
        object_pairs_hook=_unique_object,
    )
    return JournalRecord.from_json(data)


class Journal(UnconditionalExit):
    """Append-only, fsynced journal of work-item outcomes (``events.jsonl``).

    A work item is done iff it has a record here. Each `append` writes one complete line
    with ``O_APPEND`` and fsyncs before returning, so once it returns the record survives
    ``kill -9`` and power loss; a crash mid-append leaves at most a partial last line,
    which `replay` discards. One process writes a journal at a time (the supervisor holds
    the run lock); within it, appends from several threads are serialised.

    Example:
        ```python
        journal = Journal(run_dir / "events.jsonl")
        journal.open()
        done = journal.replay()
        journal.append(JournalRecord(0, 0, rollout_id, "success", reward=1.0))
        journal.close()
        ```

    Args:
        path: The journal file; created with mode 0600 by `open` when missing.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> Journal:
        self.open()
        return self

    def _exit(self) -> None:
        self.close()

    @property
    def is_open(self) -> bool:
        """Whether the append descriptor is open."""
        return self._fd is not None

    def open(self) -> None:
        """Open the journal for appending, creating it with mode 0600 when missing.

        Idempotent. The file is never followed through a symlink.

        Raises:
            OSError: The directory is missing or unwritable, or the path is a symlink.
        """
        with self._lock:
            self._open_locked()

    def _open_locked(self) -> None:
        if self._fd is not None:
            return
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.path, flags, _FILE_MODE)
        try:
            # The umask can only narrow the creation mode; an older file is tightened too.
            os.fchmod(fd, _FILE_MODE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def close(self) -> None:
        """Close the append descriptor. Idempotent; `append` reopens on demand."""
        with self._lock:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)

    def replay(self) -> dict[WorkItem, JournalRecord]:
        """Read every committed record; the latest record per work item wins.

        A partial trailing line (no final newline, left by a crash mid-append) is discarded
        and the file is truncated to its last complete line, so later appends start on a
        clean line. A missing file replays as empty.

        Returns:
            The latest record for each ``(row_index, run_index)``, in first-seen order.

        Raises:
            JournalCorruptError: A complete line is not a valid canonical record.
            OSError: The file cannot be read or truncated, or is a symlink.
        """
        with self._lock:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                return {}
            try:
                data = _read_all(fd)
                end = data.rfind(b"\n") + 1
                if end < len(data):
                    os.ftruncate(fd, end)
                    os.fsync(fd)
            finally:
                os.close(fd)
        return _records(self.path, data[:end])

    def append(self, record: JournalRecord) -> None:
        """Append ``record`` durably: every byte written with ``O_APPEND``, then fsync.

        Blocking; from a coroutine use `append_async`. Opens the journal if needed.

        Args:
            record: The outcome to commit.

        Raises:
            OSError: The write or fsync failed (a full disk...); the record is then absent:
                what part of the line was written is truncated away.
        """
        line = record.encode()
        with self._lock:
            self._open_locked()
            assert self._fd is not None
            start = os.fstat(self._fd).st_size  # one writer: O_APPEND lands here
            try:
                view = memoryview(line)
                while view:
                    written = os.write(self._fd, view)
                    view = view[written:]
                os.fsync(self._fd)
            except OSError:
                # A partial line followed by a later append would be a corrupt middle line.
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, start)
                raise

    async def append_async(self, record: JournalRecord) -> None:
        """`append` in a worker thread, so the event loop never waits on disk.

        Args:
            record: The outcome to commit.

        Raises:
            OSError: As for `append`.
        """
        await asyncio.to_thread(self.append, record)


def _records(path: Path, data: bytes) -> dict[WorkItem, JournalRecord]:
    """The latest record per work item among the complete lines of ``data``."""
    records: dict[WorkItem, JournalRecord] = {}
    for number, line in enumerate(data[: data.rfind(b"\n") + 1].split(b"\n")[:-1], start=1):
        try:
            record = _decode_line(line)
        except (ValueError, TypeError, RecursionError) as exc:  # ConfigError, JSON errors too
            raise JournalCorruptError(path, number, str(exc)) from exc
        records[record.key] = record
    return records


def read_records(path: Path) -> dict[WorkItem, JournalRecord]:
    """Read a journal another process may be appending to, changing nothing.

    Unlike `Journal.replay` it never truncates: a partial last line is ignored.

    Raises:
        JournalCorruptError: A complete line is not a valid canonical record.
        OSError: The file cannot be read, or is a symlink.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    try:
        return _records(path, _read_all(fd))
    finally:
        os.close(fd)


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def pending_items(
    all_items: Iterable[WorkItem],
    records: Mapping[WorkItem, JournalRecord],
    *,
    retry_failed: bool,
) -> list[WorkItem]:
    """The work items still to run, in the order of ``all_items``.

    Args:
        all_items: Every ``(row_index, run_index)`` of the run.
        records: The replayed journal (see `Journal.replay`).
        retry_failed: Also re-run items whose latest record is ``failed`` or ``skipped``
            (``--retry-failed``); successes are always kept.

    Returns:
        Items without a record or whose outputs could not be stored (`STORAGE_ERROR`),
        plus failed and skipped ones when ``retry_failed``.
    """
    pending: list[WorkItem] = []
    for item in all_items:
        record = records.get(item)
        if (
            record is None
            or record.error_type == STORAGE_ERROR
            or (retry_failed and record.status != "success")
        ):
            pending.append(item)
    return pending
