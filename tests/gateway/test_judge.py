"""The run's judge on the gateway: a rollout's judge route (the rollout's key, nothing
recorded), the judge's cache, concurrency limit, timeout and retries, and its key."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx2
import pytest

from osmosis_ai.errors import JudgeError
from osmosis_ai.gateway import EmbeddedPolicy, Gateway, Judge, OpenAICompatiblePolicy, Policy
from osmosis_ai.gateway.request import ChatRequest
from osmosis_ai.rollout.judge import parse_verdict, reply_text, verdict_format
from osmosis_ai.testing import ChatStub, StubFailure, StubReply

JUDGE_KEY = "judge-provider-key-7c1f9e"
VERDICT = json.dumps({"reasoning": "the answer matches", "score": 1})


def verdict_request(text: str = "grade this") -> dict[str, Any]:
    return {
        "model": "judge",
        "messages": [{"role": "user", "content": text}],
        "response_format": verdict_format(0, 1),
    }


def judge_of(stub: ChatStub, **limits: Any) -> Judge:
    policy = OpenAICompatiblePolicy(stub.base_url, api_key=JUDGE_KEY)
    return Judge(policy, label="stub judge", **limits)


async def test_a_rollouts_judge_route_answers_with_its_key_and_records_nothing() -> None:
    async with (
        ChatStub(respond=lambda body: StubReply(content=VERDICT)) as judge_stub,
        ChatStub() as policy_stub,
        Gateway(OpenAICompatiblePolicy(policy_stub.base_url), judge=judge_of(judge_stub)) as gw,
        httpx2.AsyncClient() as http,
    ):
        headers = {"Authorization": f"Bearer {gw.token}"}
        base = gw.chat_completions_url("r1")
        policy_call = await http.post(
            f"{base}/chat/completions", json=verdict_request("solve"), headers=headers
        )
        judged = await http.post(
            f"{base}/judge/chat/completions", json=verdict_request(), headers=headers
        )
        refused = await http.post(f"{base}/judge/chat/completions", json=verdict_request())
        streamed = await http.post(
            f"{base}/judge/chat/completions",
            json={**verdict_request(), "stream": True},
            headers=headers,
        )
        records = gw.records.calls("r1")
    assert policy_call.status_code == judged.status_code == 200
    assert parse_verdict(reply_text(judged.json()), 0, 1).score == 1
    # Only the policy's call is the rollout's: the judge's tokens are no training data.
    assert len(records) == 1 and records[0].messages_sha256 is not None
    assert [r["body"]["messages"][0]["content"] for r in policy_stub.requests] == ["solve"]
    [asked] = judge_stub.requests
    assert asked["headers"]["authorization"] == f"Bearer {JUDGE_KEY}"
    # Whole answers at temperature 0 unless the request says otherwise, structured output kept.
    assert asked["body"]["temperature"] == 0 and asked["body"]["response_format"]["type"] == (
        "json_schema"
    )
    assert refused.status_code == 401
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "stream"


async def test_a_run_without_a_judge_answers_404_saying_how_to_configure_one() -> None:
    async with (
        ChatStub() as stub,
        Gateway(OpenAICompatiblePolicy(stub.base_url)) as gw,
        httpx2.AsyncClient() as http,
    ):
        answer = await http.post(
            f"{gw.chat_completions_url('r1')}/judge/chat/completions",
            json=verdict_request(),
            headers={"Authorization": f"Bearer {gw.token}"},
        )
    assert answer.status_code == 404
    assert "[judge] section" in answer.json()["error"]["message"]


async def test_the_same_request_is_judged_once_in_a_run_even_when_asked_at_once() -> None:
    async with ChatStub(respond=lambda body: StubReply(content=VERDICT, delay_sec=0.2)) as stub:
        judge = judge_of(stub)
        await judge.policy.start()
        try:
            answers = await asyncio.gather(
                *(judge.complete(judge.request(verdict_request())) for _ in range(3))
            )
            again = await judge.complete(judge.request(verdict_request()))
            other = await judge.complete(judge.request(verdict_request("another trajectory")))
        finally:
            await judge.policy.aclose()
    assert len(stub.requests) == 2  # one per distinct request
    assert all(reply_text(a) == VERDICT for a in [*answers, again, other])
    assert judge.usage.calls == 2 and judge.usage.cache_hits == 3
    assert judge.usage.prompt_tokens == 14 and judge.usage.completion_tokens == 6
    # A caller changing its copy of an answer changes nobody else's.
    answers[0]["choices"].clear()
    assert reply_text(await judge.complete(judge.request(verdict_request()))) == VERDICT


class _CountingPolicy(Policy):
    """Answers after a while, counting how many of its calls overlap."""

    kind = "counting"

    def __init__(self, delay_sec: float) -> None:
        self.delay_sec = delay_sec
        self.in_flight = self.most_in_flight = 0

    @property
    def model(self) -> str:
        return "counting"

    async def complete(self, request: ChatRequest) -> dict[str, Any]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_sec)
        finally:
            self.in_flight -= 1
        message = {"role": "assistant", "content": VERDICT}
        return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}

    def stream(self, request: ChatRequest) -> Any:
        raise NotImplementedError


async def test_at_most_concurrency_judge_calls_are_in_flight() -> None:
    policy = _CountingPolicy(delay_sec=0.1)
    judge = Judge(policy, label="counting", concurrency=2)
    await asyncio.gather(
        *(judge.complete(judge.request(verdict_request(str(i)))) for i in range(6))
    )
    assert policy.most_in_flight == 2 and judge.usage.calls == 6


async def test_a_timed_out_or_failed_call_is_tried_again_and_then_fails_naming_the_judge(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with ChatStub() as stub:
        judge = judge_of(stub, timeout_sec=0.3, retries=1)
        await judge.policy.start()
        try:
            # A server error, then an answer: the retry is the answer.
            stub.push(StubFailure(503), StubReply(content=VERDICT))
            answer = await judge.complete(judge.request(verdict_request("flaky")))
            # Too slow twice: a timeout after both tries.
            stub.push(
                StubReply(content=VERDICT, delay_sec=1), StubReply(content=VERDICT, delay_sec=1)
            )
            with caplog.at_level(logging.WARNING), pytest.raises(JudgeError) as slow:
                await judge.complete(judge.request(verdict_request("slow")))
            # A request the model refuses is not tried again.
            stub.push(StubFailure(400, message=f"bad request for key {JUDGE_KEY}"))
            with pytest.raises(JudgeError) as refused:
                await judge.complete(judge.request(verdict_request("refused")))
        finally:
            await judge.policy.aclose()
    assert reply_text(answer) == VERDICT
    assert str(slow.value) == "the judge stub judge timed out after 0.3 s (after 2 tries)"
    assert str(refused.value).startswith("the judge stub judge failed: upstream answered 400")
    assert JUDGE_KEY not in str(refused.value)
    assert judge.usage.retries == 2 and judge.usage.failures == 2 and judge.usage.calls == 1
    # A failure is not cached: the same request is asked again.
    assert len([r for r in stub.requests if "slow" in json.dumps(r["body"])]) == 2
    assert JUDGE_KEY not in caplog.text


async def test_the_judges_key_is_redacted_from_the_gateways_answers_and_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with (
        ChatStub() as judge_stub,
        ChatStub() as policy_stub,
        Gateway(OpenAICompatiblePolicy(policy_stub.base_url), judge=judge_of(judge_stub)) as gw,
        httpx2.AsyncClient() as http,
    ):
        judge_stub.push(StubFailure(401, message=f"invalid key {JUDGE_KEY}"))
        with caplog.at_level(logging.DEBUG):
            answer = await http.post(
                f"{gw.chat_completions_url('r1')}/judge/chat/completions",
                json=verdict_request(),
                headers={"Authorization": f"Bearer {gw.token}"},
            )
    # Every failure of the judge is the upstream's (502) to the grader, which fails its
    # rollout with judge_error.
    assert answer.status_code == 502 and "upstream answered 401" in answer.text
    assert JUDGE_KEY not in answer.text and "[REDACTED]" in answer.text
    assert JUDGE_KEY not in caplog.text


@pytest.mark.slow
async def test_the_embedded_model_judges_in_the_verdicts_json_shape() -> None:
    """The embedded model answers a verdict under the schema's grammar: a JSON object with
    its reasoning and a score (a small model's score is not expected to be right)."""
    judge = Judge(EmbeddedPolicy(), label="embedded", max_tokens=200)
    request = {
        "messages": [
            {"role": "system", "content": "Grade the answer. Answer in JSON."},
            {"role": "user", "content": "Question: 2+2. Reference: 4. Answer: 4."},
        ],
        "response_format": verdict_format(0, 1),
    }
    await judge.policy.start()
    try:
        answer = await judge.complete(judge.request(request))
    finally:
        await judge.policy.aclose()
    verdict = json.loads(reply_text(answer))
    assert set(verdict) == {"reasoning", "score"}, verdict
    assert isinstance(verdict["score"], int | float) and isinstance(verdict["reasoning"], str)
    assert judge.usage.calls == 1 and judge.usage.completion_tokens > 0
