"""Which rows train, which are held out, and which rows a step samples."""

from __future__ import annotations

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.train.loop.rows import split_rows, step_rows


def test_held_out_split_is_seeded_disjoint_and_sized_by_count_or_fraction() -> None:
    train, held = split_rows(10, 3, seed=1)
    assert len(held) == 3 and sorted(train + held) == list(range(10))
    assert split_rows(10, 3, seed=1) == (train, held)
    assert split_rows(10, 3, seed=2) != (train, held)
    assert len(split_rows(10, 0.25, seed=0)[1]) == 2  # a fraction of the rows, rounded
    with pytest.raises(ConfigError, match=r"\[eval\] rows"):
        split_rows(4, 4, seed=0)


def test_step_rows_depend_on_seed_and_step_only() -> None:
    rows = list(range(20))
    first = step_rows(rows, 4, seed=0, step=3)
    assert len(set(first)) == 4 and set(first) <= set(rows)
    assert step_rows(rows, 4, seed=0, step=3) == first  # a resumed run picks the same rows
    assert step_rows(rows, 4, seed=0, step=4) != first
    assert sorted(step_rows(rows[:3], 4, seed=0, step=1)) == rows[:3]
