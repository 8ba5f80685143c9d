"""Judges in ``osmosis train run`` (in this process; the policy is a tiny random model on the
torch engine, the judge a stub model of its own): a `JudgeGrader`'s scores and the group
judge's train two steps, and no judge token is ever in the training records."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from osmosis_ai.testing import ChatStub, StubReply
from tests.train.training_project import lines, train_here, workspace

pytestmark = [pytest.mark.slow, pytest.mark.whole_run]

JUDGE_KEY = "judge-key-" + secrets.token_hex(8)
_FINAL = re.compile(r"# Final answer\n(.*)\Z", re.DOTALL)
_ATTEMPTS = re.compile(r"Final answer of attempt \d+: (.*)")


def _score(answer: str) -> float:
    return (len(answer) % 5) / 4  # differs between a group's sampled replies


def _verdict(body: dict[str, Any]) -> StubReply:
    if len(body["messages"]) == 1:  # the run's preflight of the judge
        return StubReply(content="ok")
    system, user = (m["content"] for m in body["messages"])
    if "You compare" in system:
        scores = [_score(answer) for answer in _ATTEMPTS.findall(user)]
        return StubReply(content=json.dumps({"reasoning": "by length", "scores": scores}))
    final = m[1] if (m := _FINAL.search(user)) else ""
    return StubReply(content=json.dumps({"reasoning": "by length", "score": _score(final)}))


@pytest_asyncio.fixture
async def judge_stub() -> AsyncIterator[ChatStub]:
    async with ChatStub(model="judge-model", respond=_verdict) as stub:
        yield stub


def _judged(stub: ChatStub) -> list[str]:
    return [
        r["body"]["messages"][-1]["content"]
        for r in stub.requests
        if r["body"]["messages"][0]["role"] == "system"
    ]


def _sequence_text(run_dir: Path) -> str:
    return "".join(
        segment["text"]
        for path in sorted((run_dir / "sequences").glob("step-*.jsonl"))
        for record in lines(path)
        for segment in record["segments"]
    )


async def test_a_judge_graders_scores_train_two_steps_and_no_judge_token_is_trained_on(
    tmp_path: Path,
    tiny_model_dir: Path,
    judge_stub: ChatStub,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JUDGE_KEY", JUDGE_KEY)
    config = workspace(
        tmp_path / "ws",
        tiny_model_dir,
        'steps = 2\n[learner]\nprecision = "fp32"\n[tracking]\nrecord_sequences = 2\n'
        f'[judge]\nmodel = "openai:{judge_stub.base_url}:judge-model"\n'
        'api_key_env = "JUDGE_KEY"\n[env]\nTINY_GRADER = "judge"\n',
    )
    outcome = await train_here(config)
    assert outcome.steps_done == 2
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    metrics = lines(run_dir / "metrics.jsonl")
    assert all(line["updates"] > 0 for line in metrics), metrics
    rollouts = lines(run_dir / "rollouts.jsonl")
    trained = [r for r in rollouts if not r["rollout_id"].startswith("eval-")]
    assert len(trained) == 12 and all(r["status"] == "success" for r in trained)
    # Every rollout (the held-out ones too) got the judge's score of its own reply; the judge
    # was asked each distinct trajectory once (the same one again is the run's cache's).
    for rollout in rollouts:
        trajectory = json.loads(
            (run_dir / "rollouts" / rollout["rollout_id"] / "trajectory.json").read_text()
        )
        reply = trajectory["steps"][-1]["message"]
        assert rollout["reward"] == _score(reply), (rollout, reply)
    prompts = _judged(judge_stub)
    assert len(set(prompts)) == len(prompts) and 12 <= len(prompts) <= len(rollouts)
    assert {r["headers"]["authorization"] for r in judge_stub.requests} == {f"Bearer {JUDGE_KEY}"}
    assert sum(line["judge_calls"] for line in metrics) >= 12
    assert all(line["judge_failures"] == 0 for line in metrics)
    # The judge's tokens are not the policy's: no trained sequence holds its prompt or answer.
    text = _sequence_text(run_dir)
    assert text and "# Rubric" not in text and "by length" not in text
    assert all(JUDGE_KEY not in p.read_text(errors="replace") for p in _files(run_dir))


async def test_the_group_judges_scores_train_two_steps(
    tmp_path: Path, tiny_model_dir: Path, judge_stub: ChatStub
) -> None:
    config = workspace(
        tmp_path / "ws",
        tiny_model_dir,
        'steps = 2\n[learner]\nprecision = "fp32"\n'
        f'[judge]\nmodel = "openai:{judge_stub.base_url}:judge-model"\n'
        'group_rubric = "Which reply counts best?"\ngroup_reference = false\n',
    )
    outcome = await train_here(config)
    assert outcome.steps_done == 2
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    prompts = _judged(judge_stub)
    # One call per group: 2 per step of 3 attempts each, and one per held-out row of one
    # attempt at the start and the end (a reply the same as before is answered from the cache).
    attempts = sorted(p.count("## Attempt") for p in prompts)
    assert attempts.count(3) == 4 and 2 <= attempts.count(1) <= 4, attempts
    assert len(set(prompts)) == len(prompts)
    assert all("Reference" not in p for p in prompts)
    for rollout in lines(run_dir / "rollouts.jsonl"):
        verdict = json.loads(
            (run_dir / "rollouts" / rollout["rollout_id"] / "group_judge.json").read_text()
        )
        assert rollout["reward"] == verdict["score"] and verdict["reasoning"] == "by length"
    assert all(line["updates"] > 0 for line in lines(run_dir / "metrics.jsonl"))


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]
