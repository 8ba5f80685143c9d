"""Training sequences from real gateway call records (the embedded model behind a real gateway)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx2
import pytest
import pytest_asyncio

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway import CallRecord, EmbeddedPolicy, Gateway
from osmosis_ai.gateway.calls import CallData
from osmosis_ai.rollout.types import RolloutResultResponse
from osmosis_ai.train import (
    Exclusion,
    GrammarSpan,
    RolloutRecords,
    SequenceStats,
    TrainingSequence,
    TruncationSpan,
    build_sequences,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "maxLength": 16}},
            "required": ["expression"],
        },
    },
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def conversations() -> AsyncIterator[dict[str, list[CallRecord]]]:
    """Two real conversations' call records, and the same records as served over HTTP."""
    async with Gateway(EmbeddedPolicy(), sampling={"temperature": 0, "seed": 7}) as gateway:
        headers = {"Authorization": f"Bearer {gateway.token}"}
        async with httpx2.AsyncClient(
            base_url=gateway.base_url, headers=headers, timeout=120
        ) as http:

            async def ask(rollout: str, messages: list[dict[str, Any]], **body: Any) -> Any:
                response = await http.post(
                    f"/v1/rollouts/{rollout}/chat/completions",
                    json={"messages": messages, **body},
                )
                assert response.status_code == 200, response.text
                message = response.json()["choices"][0]["message"]
                messages.append(message)
                return message

            # Plain chat: user, reply, user, reply.
            plain: list[dict[str, Any]] = [{"role": "user", "content": "Name a color."}]
            await ask("plain", plain, max_tokens=12)
            plain.append({"role": "user", "content": "Another one."})
            await ask("plain", plain, max_tokens=12)

            # Tools: a tool call, its result, an answer, a user follow-up, a reply.
            tool: list[dict[str, Any]] = [
                {"role": "user", "content": "What is 2+3? Use the calculator."}
            ]
            call = await ask("tool", tool, tools=[CALCULATOR], max_tokens=40)
            assert call.get("tool_calls"), call
            tool_call_id = call["tool_calls"][0]["id"]
            tool.append({"role": "tool", "tool_call_id": tool_call_id, "content": "5"})
            await ask("tool", tool, tools=[CALCULATOR], max_tokens=24)
            tool.append({"role": "user", "content": "Reply with only the number."})
            await ask("tool", tool, tools=[CALCULATOR], max_tokens=24)

            served = (await http.get("/v1/rollouts/tool/calls")).json()["calls"]
        yield {
            "plain": gateway.records.calls("plain"),
            "tool": gateway.records.calls("tool"),
            "tool_json": served,
        }


def _success(rollout_id: str, reward: float | None = 1.0, **sample: Any) -> RolloutResultResponse:
    return RolloutResultResponse(
        rollout_id=rollout_id, status="success", sample={"reward": reward, **sample}
    )


def _build(
    calls: Sequence[CallRecord | Mapping[str, Any]], **options: Any
) -> tuple[list[TrainingSequence], SequenceStats]:
    return build_sequences([RolloutRecords(_success("r"), "g", calls)], **options)


def _tokens(call: CallRecord) -> tuple[list[int], list[int], list[float]]:
    assert call.prompt_token_ids is not None
    return (
        list(call.prompt_token_ids),
        list(call.completion_token_ids or []),
        list(call.logprobs or []),
    )


def _holder(sequences: list[TrainingSequence], call: CallRecord) -> TrainingSequence:
    """The one sequence that holds ``call``: its prompt, then its completion as policy tokens."""
    prompt, completion, logprobs = _tokens(call)
    end = len(prompt) + len(completion)
    (holder,) = [
        s
        for s in sequences
        if list(s.token_ids[:end]) == prompt + completion and all(s.loss_mask[len(prompt) : end])
    ]
    assert list(holder.behaviour_logprobs[len(prompt) : end]) == logprobs
    return holder


async def test_a_plain_follow_up_merges_into_one_masked_sequence(
    conversations: dict[str, list[CallRecord]],
) -> None:
    first, second = conversations["plain"]
    (sequence,), stats = _build([first, second])
    assert stats.merges == 1 and stats.drift == 0 and stats.new_contexts == 0
    assert _holder([sequence], first) is _holder([sequence], second) is sequence
    prompt, completion, _ = _tokens(first)
    second_prompt, second_completion, _ = _tokens(second)
    # The user turn and template tokens between the replies are context; replies carry loss.
    expected_mask = (
        [0] * len(prompt)
        + [1] * len(completion)
        + [0] * (len(second_prompt) - len(prompt) - len(completion))
        + [1] * len(second_completion)
    )
    assert list(sequence.loss_mask) == expected_mask
    assert list(sequence.token_ids) == second_prompt + second_completion
    masked_logprobs = [
        lp for lp, m in zip(sequence.behaviour_logprobs, expected_mask, strict=True) if not m
    ]
    assert set(masked_logprobs) == {0.0}
    assert stats.policy_tokens == len(completion) + len(second_completion)
    assert (sequence.rollout_id, sequence.group_id, sequence.reward) == ("r", "g", 1.0)


async def test_tool_conversation_forks_on_drift_and_on_a_rewritten_system_prompt(
    conversations: dict[str, list[CallRecord]],
) -> None:
    calls = conversations["tool"]
    sequences, stats = _build(calls, drift="fork")
    # The embedded policy answers after a tool result under another system prompt (a new
    # context), and the follow-up re-renders the tool call as indented JSON, which is not
    # the text the model generated (drift).
    assert (stats.merges, stats.drift, stats.new_contexts) == (0, 1, 1)
    assert len(sequences) == 3
    holders = [_holder(sequences, call) for call in calls]
    assert len({id(holder) for holder in holders}) == 3
    for holder, call in zip(holders, calls, strict=True):
        prompt, completion, _ = _tokens(call)
        assert list(holder.loss_mask) == [0] * len(prompt) + [1] * len(completion)
    assert stats.policy_tokens == sum(len(_tokens(call)[1]) for call in calls)
    assert stats.realign_dropped_tokens == 0


async def test_realign_keeps_the_common_prefix_and_drops_the_cut_policy_tokens(
    conversations: dict[str, list[CallRecord]],
) -> None:
    first, second, third = conversations["tool"]
    sequences, stats = _build([first, second, third], drift="realign")
    assert (stats.drift, stats.new_contexts, len(sequences)) == (1, 1, 2)
    realigned = _holder(sequences, third)
    prompt, completion, _ = _tokens(first)
    shared = next(
        i
        for i, (a, b) in enumerate(zip(prompt + completion, realigned.token_ids, strict=False))
        if a != b
    )
    # Cut where the re-rendered history leaves the generated tokens: the rest of the new
    # prompt is context, and the first reply's tokens after the cut are not trained.
    assert len(prompt) <= shared < len(prompt) + len(completion)
    assert stats.realign_dropped_tokens == len(prompt) + len(completion) - shared
    third_prompt, third_completion, _ = _tokens(third)
    assert list(realigned.loss_mask) == (
        [0] * len(prompt)
        + [1] * (shared - len(prompt))
        + [0] * (len(third_prompt) - shared)
        + [1] * len(third_completion)
    )
    dropped_policy = len(_tokens(first)[1]) - (shared - len(prompt))
    total = sum(len(_tokens(call)[1]) for call in (first, second, third))
    assert stats.policy_tokens == total - dropped_policy


async def test_records_in_json_form_give_the_same_sequences(
    conversations: dict[str, Any],
) -> None:
    for drift in ("fork", "realign"):
        from_objects, _ = _build(conversations["tool"], drift=drift)
        from_json, _ = _build(conversations["tool_json"], drift=drift)
        assert from_json == from_objects


def _record(
    index: int,
    prompt: list[int] | None,
    completion: list[int],
    logprobs: list[float],
    *,
    error: str | None = None,
    grammar: str | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    finish_reason: str | None = None,
    history_rewritten: bool = False,
) -> CallRecord:
    data = CallData(
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=logprobs,
        grammar=grammar,
        top_k=top_k,
        top_p=top_p,
        finish_reason=finish_reason,
        history_rewritten=history_rewritten,
    )
    return CallRecord.from_call(
        rollout_id="r",
        index=index,
        started_at=0.0,
        latency_ms=1.0,
        stream=False,
        messages_sha256="0" * 64,
        data=None if error else data,
        error=error,
    )


async def test_failed_calls_are_skipped_and_do_not_break_the_chain() -> None:
    calls = [
        _record(0, [1, 2], [3, 4], [-0.1, -0.2]),
        _record(1, None, [], [], error="upstream timed out"),
        _record(2, [1, 2, 3, 4, 5], [6], [-0.3]),
    ]
    (sequence,), stats = _build(calls)
    assert (stats.calls, stats.failed_calls, stats.merges) == (3, 1, 1)
    assert sequence.token_ids == (1, 2, 3, 4, 5, 6)
    assert sequence.loss_mask == (0, 0, 1, 1, 0, 1)
    assert sequence.behaviour_logprobs == (0.0, 0.0, -0.1, -0.2, 0.0, -0.3)


async def test_retrying_the_same_prompt_is_a_new_sequence_not_drift() -> None:
    calls = [_record(0, [1, 2], [3], [-0.1]), _record(1, [1, 2], [4], [-0.2])]
    sequences, stats = _build(calls, drift="realign")
    assert [s.token_ids for s in sequences] == [(1, 2, 3), (1, 2, 4)]
    assert (stats.drift, stats.new_contexts, stats.realign_dropped_tokens) == (0, 1, 0)


@pytest.mark.parametrize(
    ("options", "sequences", "dropped"),
    [
        # A new sequence at the rewritten call, whatever the drift policy: nothing cut.
        ({"drift": "fork"}, [(1, 2, 3, 4), (1, 2, 9, 5)], 0),
        ({"drift": "realign"}, [(1, 2, 3, 4), (1, 2, 9, 5)], 0),
        # One sequence per rollout (verl): realigned, the cut reply's tokens counted.
        ({"drift": "realign", "one_sequence": True}, [(1, 2, 9, 5)], 2),
    ],
)
async def test_a_call_whose_history_the_template_rewrote_is_counted_apart_from_drift(
    options: dict[str, Any], sequences: list[tuple[int, ...]], dropped: int
) -> None:
    # The second prompt leaves the first at its reply (3, 4 rendered otherwise as 9): as
    # drift would, but the gateway marked it.
    calls = [
        _record(0, [1, 2], [3, 4], [-0.1, -0.2]),
        _record(1, [1, 2, 9], [5], [-0.3], history_rewritten=True),
    ]
    built, stats = _build(calls, **options)
    assert [s.token_ids for s in built] == sequences
    assert (stats.history_rewrites, stats.drift, stats.new_contexts) == (1, 0, 0)
    assert stats.realign_dropped_tokens == dropped
    _, unmarked_stats = _build([calls[0], _record(1, [1, 2, 9], [5], [-0.3])], **options)
    assert (unmarked_stats.history_rewrites, unmarked_stats.drift) == (0, 1)


async def test_unusable_rollouts_are_excluded_with_counted_reasons() -> None:
    good = [_record(0, [1], [2], [-0.5])]
    rollouts = [
        RolloutRecords(_success("ok"), "g1", good),
        RolloutRecords(
            RolloutResultResponse(rollout_id="f", status="failure", err_message="boom"), "g1", good
        ),
        RolloutRecords(_success("removed", None, remove_sample=True), "g1", good),
        RolloutRecords(_success("unrewarded", None), "g1", good),
        RolloutRecords(_success("silent"), "g2", []),
        RolloutRecords(_success("errored"), "g2", [_record(0, None, [], [], error="x")]),
        RolloutRecords(_success("no-ids"), "g2", [_record(0, None, [2], [-0.5])]),
        RolloutRecords(_success("short"), "g2", [_record(0, [1], [2, 3], [-0.5])]),
        RolloutRecords(_success("empty"), "g2", [_record(0, [1], [], [])]),
        RolloutRecords(_success("nan"), "g2", [_record(0, [1], [2, 3], [-0.5, math.nan])]),
        RolloutRecords(_success("inf"), "g2", [_record(0, [1], [2], [-math.inf])]),
    ]
    sequences, stats = build_sequences(rollouts)
    assert [s.rollout_id for s in sequences] == ["ok"]
    assert stats.excluded == {
        Exclusion.FAILED: 1,
        Exclusion.REMOVED: 1,
        Exclusion.NO_REWARD: 1,
        Exclusion.NO_CALLS: 2,
        Exclusion.NO_TOKEN_IDS: 1,
        Exclusion.BAD_LOGPROBS: 1,
        Exclusion.NO_POLICY_TOKENS: 1,
        Exclusion.NON_FINITE_LOGPROBS: 2,
    }
    assert (stats.rollouts, stats.rollouts_used) == (11, 1)
    assert (stats.groups, stats.groups_without_sequences) == (2, 1)
    assert stats.to_json()["excluded"]["no_calls"] == 2


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("prompt_token_ids", "1 2 3"),
        ("completion_token_ids", [1.5]),
        ("logprobs", ["-0.1"]),
        ("prompt_token_ids", [True]),
    ],
)
async def test_malformed_json_records_name_the_field(field: str, value: Any) -> None:
    record = _record(0, [1], [2], [-0.1]).to_json() | {field: value}
    with pytest.raises(ConfigError, match=rf"rollout 'r'.*'{field}' must be a list"):
        _build([record])


async def test_a_json_record_with_a_grammar_that_is_not_text_is_refused() -> None:
    record = _record(0, [1], [2], [-0.1]).to_json() | {"grammar": 5}
    with pytest.raises(ConfigError, match=r"rollout 'r'.*'grammar' must be a string"):
        _build([record])


async def test_completions_under_a_grammar_keep_it_as_spans_through_merges_and_realigns() -> None:
    calls = [
        _record(0, [1, 2], [3, 4, 5], [-0.1, -0.2, -0.3], grammar="tool"),
        _record(1, [1, 2, 3, 4, 5, 6], [7, 8], [-0.4, -0.5]),
        _record(2, [1, 2, 3, 4, 5, 6, 7, 8, 9], [10], [-0.6], grammar="answer"),
    ]
    (sequence,), _ = _build(calls)
    assert sequence.grammar_spans == (GrammarSpan(2, 5, "tool"), GrammarSpan(9, 10, "answer"))
    # The JSON form of the records (GET /v1/rollouts/{id}/calls) carries them too.
    assert _build([call.to_json() for call in calls])[0] == [sequence]
    # A realign that cuts into a constrained completion keeps the span's part before the cut.
    drifted = _record(1, [1, 2, 3, 9], [7], [-0.4], grammar="answer")
    (realigned,), stats = _build([calls[0], drifted], drift="realign")
    assert stats.drift == 1 and realigned.token_ids == (1, 2, 3, 9, 7)
    assert realigned.grammar_spans == (GrammarSpan(2, 3, "tool"), GrammarSpan(4, 5, "answer"))


async def test_completions_sampled_with_top_k_or_top_p_keep_them_as_spans() -> None:
    """A workflow's own top_k/top_p travel from the call records to the sequence (the learner
    cuts the same distribution); an uncut call (top_k 0, top_p 1) gives no span, and a realign
    keeps a span's part before the cut."""
    calls = [
        _record(0, [1, 2], [3, 4, 5], [-0.1, -0.2, -0.3], top_k=20, top_p=0.9),
        _record(1, [1, 2, 3, 4, 5, 6], [7, 8], [-0.4, -0.5], top_k=0, top_p=1.0),
        _record(2, [1, 2, 3, 4, 5, 6, 7, 8, 9], [10], [-0.6], top_p=0.5),
    ]
    (sequence,), _ = _build(calls)
    assert sequence.truncation_spans == (
        TruncationSpan(2, 5, 20, 0.9),
        TruncationSpan(9, 10, 0, 0.5),
    )
    assert _build([call.to_json() for call in calls])[0] == [sequence]
    drifted = _record(1, [1, 2, 3, 9], [7], [-0.4])
    (realigned,), _ = _build([calls[0], drifted], drift="realign")
    assert realigned.truncation_spans == (TruncationSpan(2, 3, 20, 0.9),)


@pytest.mark.parametrize(
    ("field", "value"),
    [("top_k", -1), ("top_k", 2.5), ("top_k", True), ("top_p", 0), ("top_p", "1")],
)
async def test_a_json_record_with_a_bad_top_k_or_top_p_is_refused(field: str, value: Any) -> None:
    record = _record(0, [1], [2], [-0.1]).to_json() | {field: value}
    with pytest.raises(ConfigError, match=rf"rollout 'r'.*'{field}' must be"):
        _build([record])


async def test_a_sequence_knows_whether_its_rollout_ran_into_the_token_limit() -> None:
    """Every piece of a rollout carries the rollout's longest completion and whether any call
    stopped at its limit (``overlong`` acts on the rollout)."""
    calls = [
        _record(0, [1, 2], [3, 4, 5], [-0.1] * 3, finish_reason="length"),
        _record(1, [7, 8], [9], [-0.2], finish_reason="stop"),  # a new context: a fork
    ]
    pieces, _ = _build(calls)
    assert len(pieces) == 2
    assert all(p.truncated and p.longest_completion == 3 for p in pieces)
    assert _build([call.to_json() for call in calls])[0] == pieces
    (plain,), _ = _build([calls[1]])
    assert not plain.truncated and plain.longest_completion == 1


async def test_a_sequence_knows_its_turns_and_its_rollouts_turn_rewards() -> None:
    """Each completion's start and model call index (failed and empty calls have none), and
    the sample's turn rewards, for credit per turn."""
    calls = [
        _record(0, [1, 2], [3, 4], [-0.1, -0.2]),
        _record(1, None, [], [], error="upstream 500"),
        _record(2, [1, 2, 3, 4, 5], [6], [-0.3]),
    ]
    result = RolloutResultResponse(
        rollout_id="r", status="success", sample={"reward": 1.0, "turn_rewards": {"2": 0.5}}
    )
    (sequence,), _ = build_sequences([RolloutRecords(result, "g", calls)])
    assert sequence.turn_starts == ((2, 0), (5, 2))
    assert sequence.turn_rewards == ((2, 0.5),)
    # A realign at the first completion's start cuts it away: the second turn is left.
    drifted = _record(2, [1, 2, 9], [6], [-0.3])
    (realigned,), _ = build_sequences(
        [RolloutRecords(result, "g", [calls[0], drifted])], drift="realign"
    )
    assert realigned.token_ids == (1, 2, 9, 6) and realigned.turn_starts == ((3, 2),)


async def test_an_unknown_drift_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="drift must be 'fork' or 'realign'"):
        _build([], drift="merge")


async def test_a_sequence_with_misaligned_fields_is_refused() -> None:
    with pytest.raises(ConfigError, match="must have the same length"):
        TrainingSequence(
            rollout_id="r",
            group_id="g",
            reward=1.0,
            token_ids=(1, 2, 3),
            loss_mask=(0, 1),
            behaviour_logprobs=(0.0, -1.0, -1.0),
        )


async def test_interleaved_conversations_each_keep_their_own_sequence() -> None:
    calls = [
        _record(0, [1, 2], [3], [-0.1]),
        _record(1, [7, 8], [9], [-0.2]),
        _record(2, [1, 2, 3, 4], [5], [-0.3]),
        _record(3, [7, 8, 9, 10], [11], [-0.4]),
    ]
    sequences, stats = _build(calls)
    assert [s.token_ids for s in sequences] == [(1, 2, 3, 4, 5), (7, 8, 9, 10, 11)]
    assert [s.loss_mask for s in sequences] == [(0, 0, 1, 0, 1)] * 2
    assert (stats.merges, stats.new_contexts, stats.drift) == (2, 1, 0)


async def test_one_sequence_realigns_every_call_of_the_tool_conversation(
    conversations: dict[str, list[CallRecord]],
) -> None:
    calls = conversations["tool"]
    (sequence,), stats = _build(calls, drift="realign", one_sequence=True)
    # The new context (another system prompt) and the drift are both realigned: the one
    # sequence is the last call's prompt and completion, nothing re-tokenised.
    assert (stats.merges, stats.drift, stats.new_contexts) == (0, 2, 0)
    last_prompt, last_completion, last_logprobs = _tokens(calls[-1])
    assert list(sequence.token_ids) == last_prompt + last_completion
    assert list(sequence.loss_mask[len(last_prompt) :]) == [1] * len(last_completion)
    assert list(sequence.behaviour_logprobs[len(last_prompt) :]) == last_logprobs
    total = sum(len(_tokens(call)[1]) for call in calls)
    assert stats.realign_dropped_tokens > 0
    assert sequence.policy_tokens == total - stats.realign_dropped_tokens
    # Every kept policy token is one a call generated, with that call's logprob.
    offsets = {}
    for call in calls:
        prompt, completion, logprobs = _tokens(call)
        for position, (token, logprob) in enumerate(zip(completion, logprobs, strict=True)):
            offsets[len(prompt) + position] = (token, logprob)
    for position, flag in enumerate(sequence.loss_mask):
        if flag:
            assert (sequence.token_ids[position], sequence.behaviour_logprobs[position]) == (
                offsets[position]
            )


async def test_one_sequence_cuts_earlier_conversations_and_counts_the_drop() -> None:
    interleaved = [
        _record(0, [1, 2], [3], [-0.1]),
        _record(1, [7, 8], [9], [-0.2]),
        _record(2, [7, 8, 9, 10], [11], [-0.4]),
    ]
    (sequence,), stats = _build(interleaved, drift="realign", one_sequence=True)
    assert sequence.token_ids == (7, 8, 9, 10, 11)
    assert sequence.loss_mask == (0, 0, 1, 0, 1)
    assert (stats.merges, stats.drift, stats.realign_dropped_tokens) == (1, 1, 1)
    retried = [_record(0, [1, 2], [3], [-0.1]), _record(1, [1, 2], [4], [-0.2])]
    (sequence,), stats = _build(retried, drift="realign", one_sequence=True)
    assert (sequence.token_ids, sequence.behaviour_logprobs) == ((1, 2, 4), (0.0, 0.0, -0.2))
    assert (stats.drift, stats.new_contexts, stats.realign_dropped_tokens) == (1, 0, 1)


async def test_one_sequence_needs_the_realign_policy() -> None:
    with pytest.raises(ConfigError, match="one_sequence=True .* pass drift='realign'"):
        _build([], one_sequence=True)


def _versioned(
    index: int, prompt: list[int], completion: list[int], version: Any
) -> dict[str, Any]:
    return {
        "index": index,
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "logprobs": [-0.5] * len(completion),
        "policy_version": version,
    }


async def test_a_sequence_keeps_the_weight_version_of_each_completion() -> None:
    """Under asynchronous training a rollout's calls may come from several versions: a chained
    sequence lists each completion's, a forked one only its own calls'."""
    chained = [_versioned(0, [1, 2], [3], 4), _versioned(1, [1, 2, 3, 9], [5, 6], 5)]
    (sequence,), _ = _build(chained)
    assert sequence.versions == (4, 5) and sequence.oldest_version == 4
    forked = [_versioned(0, [1, 2], [3], 4), _versioned(1, [7, 8], [5], 6)]
    first, second = _build(forked)[0]
    assert (first.versions, second.versions) == ((4,), (6,))
    (unversioned,), _ = _build([_versioned(0, [1, 2], [3], None)])
    assert unversioned.versions == () and unversioned.oldest_version is None


async def test_a_policy_version_that_is_not_an_integer_is_refused() -> None:
    with pytest.raises(ConfigError, match="policy_version"):
        _build([_versioned(0, [1, 2], [3], "4")])
