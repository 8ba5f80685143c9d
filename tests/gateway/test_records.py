"""Call records: bounded per rollout and in total, releasable, convertible to ATIF metrics."""

from __future__ import annotations

import pytest

from osmosis_ai.gateway import CallRecord, CallRecords
from osmosis_ai.gateway.calls import CallData


def _record(rollout: str, index: int, *, error: str | None = None) -> CallRecord:
    data = CallData(
        model="m",
        finish_reason="stop",
        usage={
            "prompt_tokens": 3,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 1},
        },
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=[4, 5],
        logprobs=[-0.1, -0.2],
    )
    return CallRecord.from_call(
        rollout_id=rollout,
        index=index,
        started_at=0.0,
        latency_ms=1.0,
        stream=False,
        messages_sha256="0" * 64,
        data=None if error else data,
        error=error,
    )


def test_calls_come_back_in_call_order() -> None:
    records = CallRecords()
    for index in (2, 0, 1):
        records.add(_record("r", index))
    assert [call.index for call in records.calls("r")] == [0, 1, 2]


def test_oldest_rollouts_are_dropped_beyond_the_bound() -> None:
    records = CallRecords(max_rollouts=2)
    for rollout in ("a", "b", "c"):
        records.add(_record(rollout, 0))
    assert records.calls("a") == [] and len(records) == 2


def test_calls_beyond_the_per_rollout_bound_are_dropped() -> None:
    records = CallRecords(max_calls_per_rollout=2)
    for index in range(5):
        records.add(_record("r", index))
    assert len(records.calls("r")) == 2


def test_idle_rollouts_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    records = CallRecords(ttl_sec=10)
    clock = [1000.0]
    monkeypatch.setattr("osmosis_ai.gateway.records.time.monotonic", lambda: clock[0])
    records.add(_record("old", 0))
    clock[0] += 11
    records.add(_record("new", 0))
    assert records.calls("old") == [] and len(records.calls("new")) == 1


def test_release_forgets_records_and_indexes() -> None:
    records = CallRecords()
    assert records.next_index("r") == 0 and records.next_index("r") == 1
    records.add(_record("r", 0))
    assert records.release("r") == 1 and records.release("r") == 0
    assert records.next_index("r") == 0


def test_take_gives_the_calls_in_order_and_forgets_them() -> None:
    records = CallRecords()
    released: list[str] = []
    records.on_release.append(released.append)
    records.add(_record("r", 1))
    records.add(_record("r", 0))
    assert [call.index for call in records.take("r")] == [0, 1]
    assert records.calls("r") == [] and released == ["r"] and records.take("r") == []


def test_report_holds_successful_calls_as_atif_metrics() -> None:
    records = CallRecords()
    records.add(_record("r", 0))
    records.add(_record("r", 1, error="boom"))
    report = records.report("r")
    assert report is not None and report.model_name == "m"
    (metrics,) = report.samples["r"].llm_call_metrics
    assert metrics.prompt_token_ids == [1, 2, 3] and metrics.completion_token_ids == [4, 5]
    assert metrics.logprobs == [-0.1, -0.2] and metrics.cached_tokens == 1
    assert records.report("unknown") is None


def test_json_form_lists_token_data() -> None:
    data = _record("r", 0).to_json()
    assert data["prompt_token_ids"] == [1, 2, 3] and data["status"] == "ok"
    failed = _record("r", 1, error="boom").to_json()
    assert failed["status"] == "error" and failed["error"] == "boom"
    assert failed["completion_token_ids"] is None
