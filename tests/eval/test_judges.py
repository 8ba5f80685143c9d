"""Judges in ``osmosis eval run`` (real CLI process, rollout server, gateway, and two stub
models: the policy and the judge): a `JudgeGrader` asks the run's ``[judge]`` at its rollout's
judge route, the group judge scores each row's runs together, a failing judge fails the
rollout with ``judge_error``, and the judge's key is never given away or written."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from osmosis_ai.testing import ChatStub, StubFailure, StubReply
from osmosis_ai.viewer.runs import rollout_detail
from tests.eval.conftest import Workspace

JUDGE_KEY = "judge-key-" + secrets.token_hex(8)
_REFERENCE = re.compile(r"# Reference answer\n(.*?)\n\n", re.DOTALL)
_FINAL = re.compile(r"# Final answer\n(.*)\Z", re.DOTALL)
_ATTEMPT = re.compile(r"Final answer of attempt \d+: (.*)")


def _verdict(body: dict[str, Any]) -> StubReply | StubFailure:
    """A judge that compares like the probe's own grader: the final answer holds the reference
    (1) or not (0). Rows whose reference names a failure get it."""
    if len(body["messages"]) == 1:  # the run's preflight of the judge
        return StubReply(content="ok")
    system, user = (m["content"] for m in body["messages"])
    reference = m[1] if (m := _REFERENCE.search(user)) else ""
    if "You compare" in system:  # the group judge: attempt i scores 1 / i
        count = len(_ATTEMPT.findall(user))
        scores = [round(1 / (i + 1), 3) for i in range(count)]
        return StubReply(content=json.dumps({"reasoning": "first is best", "scores": scores}))
    if reference == "fail":
        return StubFailure(503, message=f"judge overloaded (key {JUDGE_KEY})")
    if reference == "garbled":
        return StubReply(content="I would rather not say")
    if reference == "wide":
        return StubReply(content=json.dumps({"reasoning": "very good", "score": 7}))
    final = m[1] if (m := _FINAL.search(user)) else ""
    score = 1 if reference and reference in final else 0
    return StubReply(
        content=json.dumps({"reasoning": f"compared with {reference}", "score": score})
    )


@pytest_asyncio.fixture
async def judge_stub() -> AsyncIterator[ChatStub]:
    async with ChatStub(model="judge-model", respond=_verdict) as stub:
        yield stub


def _with_judge(workspace: Workspace, judge: ChatStub, judge_settings: str = "") -> None:
    workspace.config.write_text(
        workspace.config.read_text()
        + f'[judge]\nmodel = "openai:{judge.base_url}:judge-model"\n'
        + 'api_key_env = "JUDGE_KEY"\nretries = 1\n'
        + judge_settings
        + '[env]\nPROBE_GRADER = "judge"\n'
    )


def _judge_prompts(stub: ChatStub) -> list[str]:
    """What the judge was asked to grade (its preflight left out)."""
    return [
        r["body"]["messages"][-1]["content"]
        for r in stub.requests
        if r["body"]["messages"][0]["role"] == "system"
    ]


def _every_file(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


async def test_a_judge_grades_each_rollout_apart_from_the_policy_and_keeps_its_key(
    workspace: Workspace,
    judge_stub: ChatStub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env_drop = tmp_path / "env.json"  # what the workflow saw, written outside the output
    workspace.write_rows(
        [
            {"user_prompt": "say token0", "ground_truth": "token0"},
            {"user_prompt": "say token1", "ground_truth": "other"},
            {"user_prompt": "say hi", "ground_truth": "hi",
             "metadata": {"do": "env", "env_drop": str(env_drop)}},
        ]
    )  # fmt: skip
    _with_judge(workspace, judge_stub)
    monkeypatch.setenv("JUDGE_KEY", JUDGE_KEY)
    code, out = await workspace.run()
    assert code == 0, out
    (run_dir,) = workspace.run_dirs()
    index = [json.loads(line) for line in (run_dir / "index.jsonl").read_text().splitlines()]
    assert [row["reward"] for row in index] == [1, 0, 1]
    # Each rollout was judged once, with the judge's key, and the policy saw none of it.
    prompts = _judge_prompts(judge_stub)
    assert len(prompts) == 3 and all(p.startswith("# Rubric\nDoes the final") for p in prompts)
    assert {r["headers"]["authorization"] for r in judge_stub.requests} == {f"Bearer {JUDGE_KEY}"}
    assert all("Rubric" not in json.dumps(r["body"]) for r in workspace.stub.requests)
    for row in index:
        detail = rollout_detail(run_dir, row["rollout_id"], trials="rollout_trials")
        assert detail is not None
        # The trajectory holds the policy's one call: no judge token is the policy's.
        calls = [s for s in detail["trajectory"]["steps"] if s.get("metrics")]
        assert len(calls) == 1, detail["trajectory"]["steps"]
        [judged] = detail["judges"]
        assert judged["kind"] == "judge" and judged["reasoning"].startswith("compared with")
        assert [a["path"] for a in detail["artifacts"]] == ["judge.json"]
        metrics = detail["trajectory"]["extra"]["osmosis"]["sample_metrics"]
        assert metrics["judge_score"] == row["reward"] and metrics["judge_prompt_tokens"] == 7
    assert re.search(r"judge openai:\S+: 3 calls \(0 answered from the cache", out), out
    # The judge's key reached neither the rollout server nor any file or output.
    seen = json.loads(env_drop.read_text())
    assert "JUDGE_KEY" not in seen and JUDGE_KEY not in json.dumps(seen)
    assert all(JUDGE_KEY.encode() not in data for data in _every_file(run_dir).values())
    assert JUDGE_KEY not in out


async def test_a_failing_judge_fails_its_rollout_with_judge_error_never_a_zero(
    workspace: Workspace, judge_stub: ChatStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace.write_rows(
        [
            {"user_prompt": "say fail", "ground_truth": "fail"},
            {"user_prompt": "say garbled", "ground_truth": "garbled"},
            {"user_prompt": "say wide", "ground_truth": "wide"},
            {"user_prompt": "say token3", "ground_truth": "token3"},
        ]
    )
    _with_judge(workspace, judge_stub)
    monkeypatch.setenv("JUDGE_KEY", JUDGE_KEY)
    code, out = await workspace.run()
    assert code == 0, out  # failed rollouts are results, listed with their cause
    (run_dir,) = workspace.run_dirs()
    index = [json.loads(line) for line in (run_dir / "index.jsonl").read_text().splitlines()]
    assert [row.get("error_type") for row in index] == [
        "judge_error",
        "judge_error",
        "judge_error",
        None,
    ]
    assert [row.get("reward") for row in index] == [None, None, None, 1]
    failed = index[0]["error_message"]
    assert "answered 502" in failed and "(after 2 tries)" in failed and JUDGE_KEY not in failed
    assert "no JSON object" in index[1]["error_message"]
    assert "outside its range [0, 1]" in index[2]["error_message"]
    assert len([p for p in _judge_prompts(judge_stub) if "say fail" in p]) == 2  # retried once
    assert JUDGE_KEY not in out


async def test_the_group_judge_scores_each_rows_runs_together(
    workspace: Workspace, judge_stub: ChatStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace.write_rows(
        [{"user_prompt": f"say token{i}", "ground_truth": f"token{i}"} for i in range(2)]
    )
    workspace.write_config(evaluation="n = 3\nbatch_size = 6")
    workspace.config.write_text(
        workspace.config.read_text()
        + f'[judge]\nmodel = "openai:{judge_stub.base_url}:judge-model"\n'
        + 'group_rubric = "Which attempt says the reference best?"\n'
    )
    code, out = await workspace.run()
    assert code == 0, out
    (run_dir,) = workspace.run_dirs()
    index = [json.loads(line) for line in (run_dir / "index.jsonl").read_text().splitlines()]
    prompts = _judge_prompts(judge_stub)
    assert len(prompts) == 2  # one call per row, each seeing its three runs
    assert all(p.count("## Attempt") == 3 for p in prompts)
    assert all("# Reference answer\ntoken" in p for p in prompts)
    for row in (0, 1):
        runs = sorted((r for r in index if r["row_index"] == row), key=lambda r: r["reward"])
        assert [r["reward"] for r in runs] == [0.333, 0.5, 1]
        detail = rollout_detail(run_dir, runs[-1]["rollout_id"], trials="rollout_trials")
        assert detail is not None
        [judged] = detail["judges"]
        assert judged["kind"] == "group judge" and judged["of"] == 3
        assert judged["reasoning"] == "first is best"
