"""`JudgeGrader` and the judges' pure halves: the transcript a judge reads, its prompts, and
the parsing of its verdicts (every way an answer can be unusable is a ``JudgeError``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pydantic
import pytest

from osmosis_ai.errors import GradingError, JudgeError
from osmosis_ai.rollout import GraderContext, JudgeGrader, JudgeGraderConfig, RolloutSample
from osmosis_ai.rollout.judge import (
    group_judge_messages,
    group_verdict_format,
    judge_messages,
    parse_group_verdict,
    parse_verdict,
    reference_of,
    render_trajectory,
    verdict_format,
)
from osmosis_ai.testing import ChatStub, StubFailure, StubReply

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a calculator agent."},
    {"role": "user", "content": "What is 17*23?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "17*23"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "391"},
    {"role": "assistant", "content": [{"type": "text", "text": "It is 391."}]},
]


def test_the_transcript_shows_messages_tool_calls_and_their_results_by_name() -> None:
    assert render_trajectory(CONVERSATION) == (
        "[system]\nYou are a calculator agent.\n\n"
        "[user]\nWhat is 17*23?\n\n"
        '[assistant calls calculator]\n{"expression": "17*23"}\n\n'
        "[tool result: calculator]\n391\n\n"
        "[assistant]\nIt is 391."
    )


def test_a_long_message_is_elided_past_its_first_characters() -> None:
    transcript = render_trajectory([{"role": "tool", "content": "x" * 5000}])
    assert transcript.endswith("x [... 1000 characters elided]")


def test_the_judges_prompt_holds_the_rubric_the_reference_and_the_final_answer() -> None:
    system, user = judge_messages("Correct?", CONVERSATION, reference="391", low=0, high=10)
    assert "a number from 0 (worst) to 10 (best)" in system["content"]
    assert user["content"].startswith("# Rubric\nCorrect?\n\n# Reference answer\n391\n\n")
    assert user["content"].endswith("# Final answer\nIt is 391.")
    _, without = judge_messages("Correct?", CONVERSATION[:2], reference=None, low=0, high=1)
    assert "Reference" not in without["content"]
    assert without["content"].endswith("(none: the agent gave no final answer)")


def test_the_group_prompt_numbers_each_attempt_and_asks_for_one_score_each() -> None:
    system, user = group_judge_messages(
        "Best?", [CONVERSATION, CONVERSATION[:2]], reference="391", low=0, high=1
    )
    assert "You compare 2 attempts" in system["content"]
    assert "## Attempt 1\n" in user["content"] and "## Attempt 2\n" in user["content"]
    assert "Final answer of attempt 1: It is 391." in user["content"]
    scores = group_verdict_format(2, 0, 1)["json_schema"]["schema"]["properties"]["scores"]
    assert scores["minItems"] == scores["maxItems"] == 2


@pytest.mark.parametrize(
    "answer",
    [
        '{"reasoning": "right", "score": 0.5}',
        'Here you go:\n```json\n{"reasoning": "right", "score": 0.5}\n```',
        '{"score": 0.5, "reasoning": "right"}  trailing words',
    ],
)
def test_a_verdict_is_read_from_json_alone_fenced_or_in_prose(answer: str) -> None:
    verdict = parse_verdict(answer, 0, 1)
    assert verdict.score == 0.5 and verdict.reasoning == "right"


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("I think it is fine", "no JSON object: 'I think it is fine'"),
        ('{"reasoning": "ok"}', "has no score"),
        ('{"score": "high"}', "score is not a number: 'high'"),
        ('{"score": true}', "score is not a number: True"),
        ('{"score": NaN}', "score is not a number: nan"),
        ('{"score": 7}', "score 7 is outside its range [0, 1]"),
        ("[1, 2]", "no JSON object"),
    ],
)
def test_an_unusable_verdict_is_a_judge_error_saying_why(answer: str, message: str) -> None:
    with pytest.raises(JudgeError, match="the judge's") as raised:
        parse_verdict(answer, 0, 1)
    assert message in str(raised.value)


def test_a_group_verdict_needs_one_score_in_range_per_attempt() -> None:
    assert parse_group_verdict('{"reasoning": "r", "scores": [1, 0.25]}', 2, 0, 1) == (
        [1.0, 0.25],
        "r",
    )
    with pytest.raises(JudgeError, match="no list of 3 scores"):
        parse_group_verdict('{"scores": [1, 0]}', 3, 0, 1)
    with pytest.raises(JudgeError, match="score of attempt 2 is not a number"):
        parse_group_verdict('{"scores": [1, null]}', 2, 0, 1)


def test_the_config_refuses_an_empty_rubric_an_empty_range_and_an_unknown_reference() -> None:
    with pytest.raises(pydantic.ValidationError, match="rubric"):
        JudgeGraderConfig(rubric="")
    with pytest.raises(pydantic.ValidationError, match=r"min_score \(1\) must be below"):
        JudgeGraderConfig(rubric="r", min_score=1, max_score=1)
    with pytest.raises(pydantic.ValidationError, match='use "label", "metadata.<key>"'):
        JudgeGraderConfig(rubric="r", reference="answer")
    assert JudgeGraderConfig(rubric="r", reference="metadata.answer").name == "judge"


def test_the_reference_is_the_label_a_metadata_field_or_nothing() -> None:
    ctx = GraderContext(label="391", metadata={"answer": {"value": 391}})
    assert reference_of("label", ctx) == "391"
    assert reference_of("metadata.answer", ctx) == '{"value": 391}'
    assert reference_of(None, ctx) is None
    with pytest.raises(GradingError, match="this row has none"):
        reference_of("label", GraderContext())
    with pytest.raises(GradingError, match="metadata 'missing'"):
        reference_of("metadata.missing", ctx)


def test_a_judge_grader_needs_its_config() -> None:
    with pytest.raises(GradingError, match="needs a JudgeGraderConfig"):
        JudgeGrader(None)


async def test_a_judge_grader_rewards_the_score_and_keeps_the_verdict(tmp_path: Path) -> None:
    verdict = {"reasoning": "391 matches the reference", "score": 9}
    async with ChatStub(respond=lambda body: StubReply(content=json.dumps(verdict))) as stub:
        config = JudgeGraderConfig(
            rubric="Correct?", max_score=10, base_url=stub.base_url, model="judge-model"
        )
        sample = RolloutSample(messages=CONVERSATION)
        ctx = GraderContext(label="391", sample=sample, artifacts_dir=tmp_path / "artifacts")
        await JudgeGrader(config).grade(ctx)
    assert sample.reward == 9
    assert sample.metrics["judge_score"] == 9 and sample.metrics["judge_completion_tokens"] == 3
    record = {"score": 9, "range": [0, 10], "reasoning": "391 matches the reference"}
    assert sample.extra_fields["judge"] == record
    assert json.loads((tmp_path / "artifacts" / "judge.json").read_text()) == record
    [asked] = stub.requests
    assert asked["body"]["model"] == "judge-model" and asked["body"]["temperature"] == 0
    assert "# Reference answer\n391" in asked["body"]["messages"][1]["content"]


async def test_a_failing_judge_raises_a_judge_error_never_a_zero() -> None:
    async with ChatStub() as stub:
        config = JudgeGraderConfig(rubric="Correct?", base_url=stub.base_url)
        stub.push(StubFailure(500, message="overloaded"))
        sample = RolloutSample(messages=CONVERSATION)
        with pytest.raises(JudgeError, match="answered 500: overloaded"):
            await JudgeGrader(config).grade(GraderContext(label="391", sample=sample))
        stub.push(StubReply(content="no verdict here"))
        with pytest.raises(JudgeError, match="no JSON object"):
            await JudgeGrader(config).grade(GraderContext(label="391", sample=sample))
    assert sample.reward is None
    with pytest.raises(JudgeError, match="could not reach the judge"):
        await JudgeGrader(config).grade(GraderContext(label="391", sample=sample))


async def test_a_judge_keys_variable_must_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JUDGE_TEST_KEY", raising=False)
    config = JudgeGraderConfig(
        rubric="r", base_url="http://127.0.0.1:9/v1", api_key_env="JUDGE_TEST_KEY"
    )
    sample = RolloutSample(messages=CONVERSATION)
    with pytest.raises(GradingError, match="JUDGE_TEST_KEY is not set"):
        await JudgeGrader(config).grade(GraderContext(label="1", sample=sample))


def test_a_set_of_scores_is_asked_as_an_enum_and_nothing_else_is_taken() -> None:
    config = JudgeGraderConfig(rubric="r", scores=(1, 0, 1))
    assert (config.scores, config.low, config.high) == ((0.0, 1.0), 0.0, 1.0)
    schema = verdict_format(config.low, config.high, config.scores)["json_schema"]["schema"]
    assert schema["properties"]["score"] == {"enum": [0.0, 1.0]}
    assert parse_verdict('{"score": 1}', 0, 1, config.scores).score == 1
    with pytest.raises(JudgeError, match=r"score 0.5 is not one of its scores \(0, 1\)"):
        parse_verdict('{"score": 0.5}', 0, 1, config.scores)
    system, _ = judge_messages("r", CONVERSATION, reference=None, low=0, high=1, choices=(0, 1))
    assert '"score": <one of 0, 1 (1 is best)>' in system["content"]
    with pytest.raises(pydantic.ValidationError, match="at least two different"):
        JudgeGraderConfig(rubric="r", scores=(1, 1))


def test_a_group_judges_set_of_scores_is_an_enum_of_each_attempts_score() -> None:
    items = group_verdict_format(2, 1, 5, (1, 3, 5))["json_schema"]["schema"]["properties"]
    assert items["scores"]["items"] == {"enum": [1, 3, 5]}
    assert parse_group_verdict('{"scores": [5, 1]}', 2, 1, 5, (1, 3, 5))[0] == [5.0, 1.0]
    with pytest.raises(JudgeError, match=r"score of attempt 2 2 is not one of its scores"):
        parse_group_verdict('{"scores": [5, 2]}', 2, 1, 5, (1, 3, 5))
