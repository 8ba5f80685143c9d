"""The eval journal: canonical lines, latest-wins replay, crash tolerance and durability."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.errors import ConfigError, InvalidIdError
from osmosis_ai.eval.journal import (
    STORAGE_ERROR,
    Journal,
    JournalCorruptError,
    JournalRecord,
    pending_items,
)
from tests.eval.conftest import fill_filesystem

ROLLOUT_ID = "9b1e0d5c2a7f4e3d8c6b5a4f3e2d1c0b"


def _record(row: int = 0, run: int = 0, **fields: Any) -> JournalRecord:
    values: dict[str, Any] = {"rollout_id": f"r{row}-{run}", "status": "success"}
    values.update(fields)
    return JournalRecord(row, run, **values)


def test_encoding_is_canonical_json_without_nulls() -> None:
    record = JournalRecord(
        row_index=0,
        run_index=0,
        rollout_id=ROLLOUT_ID,
        status="success",
        source_row_index=3,
        reward=1.0,
        tokens=1520,
        duration_ms=8123.4,
    )
    assert record.encode() == (
        b'{"duration_ms":8123.4,"reward":1.0,"rollout_id":"9b1e0d5c2a7f4e3d8c6b5a4f3e2d1c0b",'
        b'"row_index":0,"run_index":0,"source_row_index":3,"status":"success","tokens":1520}\n'
    )


def test_integer_reward_is_stored_as_float() -> None:
    record = _record(reward=1, duration_ms=5)
    assert isinstance(record.reward, float) and record.reward == 1.0
    assert isinstance(record.duration_ms, float)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"rollout_id": "a/b"}, InvalidIdError),
        ({"rollout_id": ".."}, InvalidIdError),
        ({"status": "cancelled"}, ConfigError),
        ({"reward": float("nan")}, ConfigError),
        ({"reward": float("inf")}, ConfigError),
        ({"reward": True}, ConfigError),
        ({"tokens": -1}, ConfigError),
        ({"tokens": 1.5}, ConfigError),
        ({"duration_ms": -0.1}, ConfigError),
        ({"source_row_index": -1}, ConfigError),
        ({"error_type": ""}, ConfigError),
    ],
)
def test_invalid_records_are_refused_on_construction(
    fields: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        _record(**fields)


@pytest.mark.parametrize(("row", "run"), [(-1, 0), (0, -1), (True, 0)])
def test_negative_or_boolean_indices_are_refused(row: int, run: int) -> None:
    with pytest.raises(ConfigError):
        JournalRecord(row, run, "r", "success")


def test_round_trip_through_the_file(tmp_path: Path) -> None:
    records = [
        _record(0, 0, reward=0.5, tokens=10, duration_ms=1.25, source_row_index=7),
        _record(0, 1, status="failed", error_type="rollout_protocol_error"),
        _record(1, 0, status="skipped"),
    ]
    with Journal(tmp_path / "events.jsonl") as journal:
        for record in records:
            journal.append(record)
    replayed = Journal(tmp_path / "events.jsonl").replay()
    assert replayed == {record.key: record for record in records}


def test_missing_journal_replays_as_empty(tmp_path: Path) -> None:
    assert Journal(tmp_path / "events.jsonl").replay() == {}


def test_latest_record_per_item_wins(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "events.jsonl")
    journal.append(_record(0, 0, rollout_id="first", status="failed", error_type="x"))
    journal.append(_record(1, 0))
    journal.append(_record(0, 0, rollout_id="second", reward=1.0))
    journal.close()
    replayed = journal.replay()
    assert replayed[(0, 0)].rollout_id == "second"
    assert replayed[(0, 0)].status == "success"
    assert len(replayed) == 2


def test_partial_trailing_line_is_discarded_and_truncated(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal(path)
    journal.append(_record(0, 0))
    journal.append(_record(1, 0))
    committed = path.read_bytes()
    with path.open("ab") as handle:
        handle.write(b'{"row_index":2,"run_index":0,"rollout_id":"r2-0","sta')
    assert set(journal.replay()) == {(0, 0), (1, 0)}
    assert path.read_bytes() == committed
    journal.append(_record(2, 0))
    assert set(journal.replay()) == {(0, 0), (1, 0), (2, 0)}


def test_partial_only_line_truncates_to_empty(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"row_in')
    assert Journal(path).replay() == {}
    assert path.read_bytes() == b""


@pytest.mark.parametrize(
    "bad_line",
    [
        b"not json",
        b"",
        b"[1, 2]",
        b'{"row_index":0,"run_index":0,"status":"success"}',
        b'{"row_index":0,"run_index":0,"rollout_id":"a/b","status":"success"}',
        b'{"reward":NaN,"row_index":0,"run_index":0,"rollout_id":"r","status":"success"}',
        b'{"extra":1,"row_index":0,"run_index":0,"rollout_id":"r","status":"success"}',
        b'{"row_index":0,"row_index":1,"run_index":0,"rollout_id":"r","status":"success"}',
        b"\xff\xfe",
        b"[" * 100_000,
    ],
)
def test_malformed_complete_line_is_fatal_corruption(tmp_path: Path, bad_line: bytes) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(_record(0, 0).encode() + bad_line + b"\n" + _record(1, 0).encode())
    with pytest.raises(JournalCorruptError) as caught:
        Journal(path).replay()
    assert caught.value.line_number == 2
    assert caught.value.category == "internal_error"
    assert "--fresh" in str(caught.value)


def test_explicit_nulls_read_as_absent(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(
        b'{"error_type":null,"reward":null,"row_index":0,"run_index":0,'
        b'"rollout_id":"r","status":"skipped"}\n'
    )
    assert Journal(path).replay()[(0, 0)] == JournalRecord(0, 0, "r", "skipped")


def test_open_creates_the_file_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    old_umask = os.umask(0)
    try:
        Journal(path).open()
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_open_tightens_an_existing_file_to_0600(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"")
    path.chmod(0o644)
    with Journal(path):
        pass
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_open_refuses_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.jsonl"
    target.write_bytes(b"")
    link = tmp_path / "events.jsonl"
    link.symlink_to(target)
    with pytest.raises(OSError):
        Journal(link).open()


async def test_append_async_runs_off_the_event_loop(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "events.jsonl")
    await asyncio.gather(*(journal.append_async(_record(row, 0)) for row in range(20)))
    journal.close()
    assert set(journal.replay()) == {(row, 0) for row in range(20)}


def test_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "events.jsonl")
    padding = "e" * 20_000

    def worker(thread: int) -> None:
        for run in range(25):
            journal.append(_record(thread, run, status="failed", error_type=padding))

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    journal.close()
    assert len(journal.replay()) == 100


_CHILD = textwrap.dedent(
    """
    import sys
    import time

    from osmosis_ai.eval.journal import Journal, JournalRecord

    path, limit, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    deadline = time.monotonic() + seconds
    journal = Journal(path)
    journal.open()
    padding = "e" * 8192  # longer lines widen the window for a kill mid-write
    index = 0
    while index < limit and time.monotonic() < deadline:
        journal.append(
            JournalRecord(
                index, 0, f"r{index}", "failed", reward=float(index), tokens=index,
                error_type=padding,
            )
        )
        sys.stdout.write(f"{index}\\n")
        sys.stdout.flush()
        index += 1
    """
)


@pytest.mark.parametrize("attempt", range(3))
def test_kill_9_mid_run_loses_no_acknowledged_record(tmp_path: Path, attempt: int) -> None:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    path = tmp_path / "events.jsonl"
    rng = random.Random()
    kill_after = rng.randint(1, 150)
    child = subprocess.Popen(
        [sys.executable, str(script), str(path), "100000", "20"],
        stdout=subprocess.PIPE,
        text=True,
    )
    acknowledged: list[int] = []
    try:
        assert child.stdout is not None
        while len(acknowledged) < kill_after:
            line = child.stdout.readline()
            assert line, f"child ended after {len(acknowledged)} acknowledgements"
            acknowledged.append(int(line))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        # Anything still in the pipe was acknowledged before the kill, too.
        acknowledged.extend(int(line) for line in child.stdout.read().split())
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    replayed = Journal(path).replay()
    context = f"kill after {kill_after} acks, {len(acknowledged)} acknowledged"
    assert len(replayed) >= len(acknowledged), context
    assert sorted(replayed) == [(index, 0) for index in range(len(replayed))], context
    for (index, _run), record in replayed.items():
        assert record == JournalRecord(
            index,
            0,
            f"r{index}",
            "failed",
            reward=float(index),
            tokens=index,
            error_type="e" * 8192,
        )
    assert path.read_bytes().endswith(b"\n") or path.read_bytes() == b""


def test_pending_items_are_those_without_a_record() -> None:
    items = [(row, run) for row in range(3) for run in range(2)]
    records = {
        (0, 0): _record(0, 0),
        (0, 1): _record(0, 1, status="failed", error_type="x"),
        (2, 1): _record(2, 1, status="skipped"),
    }
    assert pending_items(items, records, retry_failed=False) == [(1, 0), (1, 1), (2, 0)]


def test_pending_items_include_items_whose_outputs_could_not_be_stored() -> None:
    records = {
        (0, 0): _record(0, 0, status="failed", error_type=STORAGE_ERROR, error_message="full"),
        (1, 0): _record(1, 0, status="failed", error_type="x"),
    }
    assert pending_items([(0, 0), (1, 0)], records, retry_failed=False) == [(0, 0)]


def test_a_failed_append_on_a_full_disk_leaves_no_partial_line(small_filesystem: Path) -> None:
    path = small_filesystem / "events.jsonl"
    with Journal(path) as journal:
        journal.append(_record(0, 0))
        fill_filesystem(small_filesystem / "filler")
        # Longer than what is left of the file's last page: part of it could be written.
        with pytest.raises(OSError, match="No space left"):
            journal.append(_record(1, 0, status="failed", error_message="m" * 20_000))
        (small_filesystem / "filler").unlink()
        journal.append(_record(2, 0))
    assert sorted(Journal(path).replay()) == [(0, 0), (2, 0)]
    assert path.read_bytes().count(b"\n") == 2


def test_pending_items_with_retry_failed_add_failed_and_skipped() -> None:
    items = [(row, run) for row in range(3) for run in range(2)]
    records = {
        (0, 0): _record(0, 0),
        (0, 1): _record(0, 1, status="failed", error_type="x"),
        (2, 1): _record(2, 1, status="skipped"),
    }
    assert pending_items(items, records, retry_failed=True) == [
        (0, 1),
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
    ]
