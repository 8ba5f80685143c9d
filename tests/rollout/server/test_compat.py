"""Compatibility with the reference protocol's JSON, verbatim from its documentation."""

from __future__ import annotations

import json

from osmosis_ai.rollout import RolloutErrorCategory, RolloutStatus
from osmosis_ai.rollout.types import (
    CancelRolloutsResponse,
    RolloutInitResponse,
    RolloutResultResponse,
)
from tests.rollout.server.conftest import ServeFactory

REFERENCE_INIT_REQUEST = """
{
  "rollout_id": "9b1e0d5c2a7f4e3d8c6b5a4f3e2d1c0b",
  "initial_messages": [{"role": "user", "content": "What is 6*7?"}],
  "label": "42",
  "metadata": null,
  "chat_completions_url": "http://127.0.0.1:52100/v1/rollouts/9b1e0d5c2a7f4e3d8c6b5a4f3e2d1c0b",
  "llm_api_key": "3c0f9d...",
  "grade": true,
  "agent_timeout_sec": 450.0,
  "grader_timeout_sec": 150.0,
  "extra_fields": {"row_index": 0, "run_index": 0}
}
"""
REFERENCE_INIT_RESPONSE = '{"rollout_id": "9b1e0d5c2a7f4e3d8c6b5a4f3e2d1c0b", "status": "queued", "polling_lease_token": "q3V...43 chars...", "result_wait_timeout_sec": 30.0, "polling_lease_timeout_sec": 120.0}'
REFERENCE_RUNNING = '{"rollout_id": "9b1e...", "status": "running", "sample": null, "err_message": null, "err_category": null}'
REFERENCE_LEASE_EXPIRED = '{"rollout_id": "9b1e...", "status": "failure", "sample": null, "err_message": "polling lease expired", "err_category": "lease_expired"}'
REFERENCE_SUCCESS = """
{
  "rollout_id": "9b1e0d5c2a7f4e3d8c6b5a4f3e2d1c0b",
  "status": "success",
  "sample": {"messages": [{"role": "user", "content": "What is 6*7?"}, {"role": "assistant", "content": "42"}], "label": "42", "reward": 1.0, "remove_sample": false, "metrics": {}, "extra_fields": {}},
  "err_message": null,
  "err_category": null
}
"""
REFERENCE_CANCEL_RESPONSE = (
    '{"dispositions": {"3f2c9e0a7b1d4c55a9e8f0b1c2d3e4f5": "cancelled_running"}}'
)


async def test_reference_request_is_admitted_graded_and_answered_in_reference_shape(
    serve: ServeFactory,
) -> None:
    async with serve() as server:
        admitted = await server.http.post(
            "/rollout",
            content=REFERENCE_INIT_REQUEST,
            headers={"Content-Type": "application/json"},
        )
        lease = admitted.json()
        result = await server.http.get(
            f"/rollout/{lease['rollout_id']}/result",
            headers={"X-Osmosis-Rollout-Lease": lease["polling_lease_token"]},
        )
        while result.json()["status"] not in ("success", "failure", "cancelled"):
            result = await server.http.get(
                f"/rollout/{lease['rollout_id']}/result",
                headers={"X-Osmosis-Rollout-Lease": lease["polling_lease_token"]},
            )
        cancel = await server.http.post(
            "/rollout/cancel", json={"ids": ["3f2c9e0a7b1d4c55a9e8f0b1c2d3e4f5"]}
        )
        health = (await server.http.get("/health")).json()
    assert admitted.status_code == 202
    assert set(lease) == set(json.loads(REFERENCE_INIT_RESPONSE))
    assert lease["status"] == "queued" and len(lease["polling_lease_token"]) == 43
    body = result.json()
    assert set(body) == set(json.loads(REFERENCE_SUCCESS))
    assert set(body["sample"]) == set(json.loads(REFERENCE_SUCCESS)["sample"])
    assert body["status"] == "success" and body["sample"]["reward"] == 1.0
    assert "trajectory_messages" not in body["sample"]
    assert cancel.json() == {"dispositions": {"3f2c9e0a7b1d4c55a9e8f0b1c2d3e4f5": "not_found"}}
    assert {"status", "instance_id", "process_id", "lifecycle"} <= set(health)
    assert set(health["lifecycle"]) == {"accepting_rollouts", "active_rollouts"}


def test_client_models_parse_the_reference_answers() -> None:
    lease = RolloutInitResponse.model_validate_json(REFERENCE_INIT_RESPONSE)
    assert lease.polling_lease_timeout_sec == 120.0
    running = RolloutResultResponse.model_validate_json(REFERENCE_RUNNING)
    assert running.status is RolloutStatus.RUNNING and not running.terminal
    expired = RolloutResultResponse.model_validate_json(REFERENCE_LEASE_EXPIRED)
    assert expired.err_category is RolloutErrorCategory.LEASE_EXPIRED and expired.terminal
    success = RolloutResultResponse.model_validate_json(REFERENCE_SUCCESS)
    assert success.sample is not None and success.sample.reward == 1.0
    cancel = CancelRolloutsResponse.model_validate_json(REFERENCE_CANCEL_RESPONSE)
    assert cancel.dispositions["3f2c9e0a7b1d4c55a9e8f0b1c2d3e4f5"] == "cancelled_running"


def test_answers_from_newer_servers_with_extra_fields_still_parse() -> None:
    newer = json.loads(REFERENCE_SUCCESS)
    newer["future_field"] = 1
    newer["sample"]["future_sample_field"] = {"x": 1}
    parsed = RolloutResultResponse.model_validate(newer)
    assert parsed.sample is not None and parsed.sample.label == "42"
