"""Tombstones: an id and a terminal status, expiring by time and by count, a few dozen bytes."""

from __future__ import annotations

import gc
import tracemalloc

from osmosis_ai.rollout import RolloutStatus
from osmosis_ai.rollout.server._tombstones import Tombstones


def test_a_tombstone_keeps_its_status_until_retention_has_passed() -> None:
    tombstones = Tombstones(retention_sec=10.0, max_count=100)
    tombstones.add("ok", RolloutStatus.SUCCESS, now=100.0)
    tombstones.add("bad", RolloutStatus.FAILURE, now=101.0)
    tombstones.expire(now=109.0)
    assert tombstones.status("ok") is RolloutStatus.SUCCESS
    assert tombstones.status("bad") is RolloutStatus.FAILURE
    assert "ok" in tombstones and "other" not in tombstones and len(tombstones) == 2
    tombstones.expire(now=111.5)
    assert "ok" not in tombstones and "bad" not in tombstones and len(tombstones) == 0


def test_an_id_stays_reserved_at_least_retention_and_at_most_a_sixteenth_longer() -> None:
    tombstones = Tombstones(retention_sec=16.0, max_count=1000)
    for second in range(40):  # one a second: generations of at most 1 s (16 s / 16)
        tombstones.add(f"r{second}", RolloutStatus.SUCCESS, now=float(second))
    tombstones.expire(now=39.5)
    kept = [second for second in range(40) if f"r{second}" in tombstones]
    assert kept[0] >= 39.5 - 16.0 - 1.0  # none kept longer than retention plus a sixteenth
    assert all(f"r{second}" in tombstones for second in range(24, 40))  # none dropped early


def test_the_count_cap_drops_the_oldest_first() -> None:
    tombstones = Tombstones(retention_sec=900.0, max_count=32)  # generations of 2 ids
    for index in range(40):
        tombstones.add(f"r{index}", RolloutStatus.CANCELLED, now=1.0)
    assert len(tombstones) <= 32
    assert all(f"r{index}" in tombstones for index in range(40 - len(tombstones), 40))
    assert not any(f"r{index}" in tombstones for index in range(40 - len(tombstones)))
    tombstones.trim(10)
    assert 8 <= len(tombstones) <= 10 and "r39" in tombstones


def test_a_tombstone_costs_a_few_dozen_bytes_and_nothing_for_the_collector() -> None:
    count = 20_000
    ids = [f"rollout-{index:08d}" for index in range(count)]  # the ids exist already
    tombstones = Tombstones(retention_sec=900.0, max_count=count)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for rollout_id in ids:
            tombstones.add(rollout_id, RolloutStatus.SUCCESS, now=1.0)
        per_tombstone = (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()
    assert len(tombstones) == count
    assert per_tombstone < 64, f"{per_tombstone:.0f} bytes per tombstone"
    # No dict holding tombstones is tracked: a full collection never walks them.
    holding = [o for o in gc.get_objects() if type(o) is dict and "rollout-00000001" in o]
    assert holding == []
