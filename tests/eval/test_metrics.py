"""Index rows and summary metrics: pass@k, pass rate, reward statistics, key presence."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.eval.journal import JournalRecord, JournalStatus
from osmosis_ai.eval.metrics import (
    IndexRow,
    failure_line,
    index_rows,
    pass_at_k,
    pass_at_k_points,
    summarize,
)

BASE_KEYS = {
    "total_samples",
    "completed_samples",
    "graded",
    "passed",
    "failed",
    "skipped",
    "pass_rate",
    "pass_threshold",
    "tokens_used",
}


def _row(
    row: int,
    run: int = 0,
    status: JournalStatus = "success",
    reward: float | None = None,
    tokens: int | None = None,
) -> IndexRow:
    return IndexRow(row, run, f"r{row}-{run}", status, reward=reward, tokens=tokens)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 1, 0.25),
        (4, 1, 2, 0.5),
        (4, 1, 4, 1.0),
        (5, 2, 2, 1 - (3 / 5) * (2 / 4)),
        (5, 0, 3, 0.0),
        (5, 5, 1, 1.0),
        (3, 1, 3, 1.0),  # n - c < k
        (10, 3, 4, 1 - (7 / 10) * (6 / 9) * (5 / 8) * (4 / 7)),
    ],
)
def test_pass_at_k_matches_hand_computation(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5), (0, 0, 1)])
def test_pass_at_k_refuses_out_of_range_arguments(n: int, c: int, k: int) -> None:
    with pytest.raises(ConfigError):
        pass_at_k(n, c, k)


def test_summary_of_single_runs_has_only_the_base_keys_without_rewards() -> None:
    rows = [_row(0, status="failed"), _row(1, status="skipped")]
    summary = summarize(rows, pass_threshold=1.0)
    assert set(summary) == BASE_KEYS
    assert summary["pass_rate"] == 0.0


def test_summary_counts() -> None:
    rows = [
        _row(0, reward=1.0, tokens=100),
        _row(1, reward=0.5, tokens=50),
        _row(2, status="failed", tokens=7),
        _row(3, status="skipped"),
        _row(4, reward=1.0),
    ]
    summary = summarize(rows, pass_threshold=1.0)
    assert set(summary) == BASE_KEYS | {"reward_stats"}
    assert summary["total_samples"] == 5
    assert summary["completed_samples"] == 4
    assert summary["graded"] == 3
    assert summary["passed"] == 2
    assert summary["failed"] == 1
    assert summary["skipped"] == 1
    # The failed row without a reward is a non-pass in the denominator.
    assert summary["pass_rate"] == 0.5
    assert summary["pass_threshold"] == 1.0
    assert summary["tokens_used"] == 157


def test_pass_threshold_decides_passes() -> None:
    rows = [_row(0, reward=0.7), _row(1, reward=0.69), _row(2, reward=0.2)]
    summary = summarize(rows, pass_threshold=0.7)
    assert summary["passed"] == 1
    assert summary["pass_rate"] == pytest.approx(1 / 3)
    assert summary["pass_threshold"] == 0.7


def test_empty_run_summary() -> None:
    summary = summarize([], pass_threshold=1.0)
    assert summary == {
        "total_samples": 0,
        "completed_samples": 0,
        "graded": 0,
        "passed": 0,
        "failed": 0,
        "skipped": 0,
        "pass_rate": 0.0,
        "pass_threshold": 1.0,
        "tokens_used": 0,
    }


def test_reward_stats_use_population_std() -> None:
    rewards = [0.0, 0.5, 1.0, 1.0]
    summary = summarize([_row(i, reward=r) for i, r in enumerate(rewards)], pass_threshold=1.0)
    stats = summary["reward_stats"]
    assert stats == {
        "mean": 0.625,
        "median": 0.75,
        "std": pytest.approx(math.sqrt(sum((r - 0.625) ** 2 for r in rewards) / 4)),
        "min": 0.0,
        "max": 1.0,
    }
    assert stats["std"] != pytest.approx(statistics.stdev(rewards))


def test_non_finite_pass_threshold_is_refused() -> None:
    with pytest.raises(ConfigError):
        summarize([], pass_threshold=float("nan"))


def test_multiple_runs_add_n_runs_and_pass_at_k() -> None:
    # Row 0: 4 attempts, 1 pass. Row 1: 4 attempts, 2 passes.
    rows = [_row(0, run, reward=1.0 if run == 0 else 0.0) for run in range(4)]
    rows += [_row(1, run, reward=1.0 if run < 2 else 0.0) for run in range(4)]
    summary = summarize(rows, pass_threshold=1.0)
    assert summary["n_runs"] == 4
    expected = [
        {"k": 1, "value": pytest.approx((0.25 + 0.5) / 2)},
        {"k": 2, "value": pytest.approx((0.5 + (1 - (2 / 4) * (1 / 3))) / 2)},
        {"k": 4, "value": pytest.approx(1.0)},
    ]
    assert summary["pass_at_k"] == expected


def test_pass_at_k_k_values_are_powers_of_two_up_to_n_runs() -> None:
    rows = [_row(0, run, reward=0.0) for run in range(6)]
    points = pass_at_k_points(rows, pass_threshold=1.0)
    assert [point["k"] for point in points] == [1, 2, 4]
    assert all(point["value"] == 0.0 for point in points)


def test_pass_at_k_averages_only_rows_with_enough_attempts() -> None:
    # Row 1 has a skipped attempt, so only 1 attempt: it counts for k=1 but not k=2.
    rows = [_row(0, 0, reward=1.0), _row(0, 1, reward=0.0)]
    rows += [_row(1, 0, reward=0.0), _row(1, 1, status="skipped")]
    points = pass_at_k_points(rows, pass_threshold=1.0)
    assert points == [
        {"k": 1, "value": pytest.approx((0.5 + 0.0) / 2)},
        {"k": 2, "value": pytest.approx(1.0)},
    ]


def test_pass_at_k_is_absent_with_fewer_than_two_points() -> None:
    # Two runs, but every row has only one counted attempt: only k=1 has a point.
    rows = [_row(0, 0, reward=1.0), _row(0, 1, status="skipped")]
    summary = summarize(rows, pass_threshold=1.0)
    assert summary["n_runs"] == 2
    assert "pass_at_k" not in summary


def test_index_row_json_omits_nulls_and_orders_keys_as_the_platform() -> None:
    row = IndexRow(
        row_index=0,
        run_index=1,
        rollout_id="abc",
        status="success",
        reward=1.0,
        tokens=1520,
        duration_ms=8123.4,
        trajectory_filename="trajectory.json",
        resumed=True,
        source_row_index=3,
    )
    assert list(row.to_json()) == [
        "row_index",
        "run_index",
        "rollout_id",
        "trajectory_filename",
        "status",
        "reward",
        "tokens",
        "duration_ms",
        "resumed",
    ]
    assert row.to_json()["resumed"] is True
    assert "source_row_index" not in row.to_json()


def test_index_row_json_has_resumed_only_when_true() -> None:
    row = IndexRow(0, 0, "abc", "failed", error_type="rollout_protocol_error")
    assert row.to_json() == {
        "row_index": 0,
        "run_index": 0,
        "rollout_id": "abc",
        "status": "failed",
        "error_type": "rollout_protocol_error",
    }
    json.dumps(row.to_json(), allow_nan=False)


def test_index_rows_are_sorted_and_flag_resumed_items() -> None:
    records = {
        (1, 0): JournalRecord(1, 0, "b", "success", reward=1.0, tokens=3, source_row_index=9),
        (0, 1): JournalRecord(0, 1, "a1", "failed", error_type="x"),
        (0, 0): JournalRecord(0, 0, "a0", "skipped"),
    }
    rows = index_rows(
        records,
        resumed_keys={(1, 0)},
        trajectory_filenames={"b": "trajectory.json", "stale": "trajectory.json"},
    )
    assert [row.key for row in rows] == [(0, 0), (0, 1), (1, 0)]
    assert rows[2] == IndexRow(
        1,
        0,
        "b",
        "success",
        reward=1.0,
        tokens=3,
        trajectory_filename="trajectory.json",
        resumed=True,
        source_row_index=9,
    )
    assert rows[0].trajectory_filename is None and not rows[0].resumed
    assert rows[1].error_type == "x"


def test_failure_line_counts_categories_most_first_and_quotes_the_first_message() -> None:
    failures = [
        ("timeout", None),
        ("agent_error", "workflow raised KeyError: 'x'\nTraceback (most recent call last):"),
        ("agent_error", "workflow raised ValueError"),
        (None, "lost"),
    ]
    assert failure_line(failures, 10) == (
        "4 of 10 rollouts failed (agent_error 2, timeout 1, unknown 1); "
        "first: workflow raised KeyError: 'x'"
    )
    assert failure_line([("http_error", "  ")], 1) == "1 of 1 rollouts failed (http_error 1)"
