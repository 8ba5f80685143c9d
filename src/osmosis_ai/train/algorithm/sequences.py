"""Training sequences from a rollout's gateway call records (pure: no torch, no I/O).

Each call record holds the exact prompt and completion token ids the policy saw and produced,
and the behaviour logprob of every completion token. Calls of one rollout are chained into as
few sequences as the token ids allow:

- **merge**: a call whose prompt ids start with a sequence's ids continues that sequence; the
  new prompt tokens (tool results, user turns, template tokens) are context (mask 0) and the
  completion is policy output (mask 1).
- **drift**: the prompt keeps the sequence up to its last completion but diverges inside it or
  right after it (re-tokenising the completion's text gave other ids). ``drift="fork"`` starts
  a separate sequence with the call's own prompt; ``drift="realign"`` cuts the sequence at the
  longest common prefix, appends the rest of the new prompt as context (mask 0) and drops the
  cut policy tokens from training (counted).
- **new context**: the prompt diverges before the last completion (history the agent edited,
  another conversation): a separate sequence, unless ``one_sequence=True``.
- **history rewritten by the template**: the gateway marks a call whose messages continue an
  earlier call while the chat template renders that call otherwise now (Qwen3-style templates
  drop earlier ``<think>`` blocks once a new user turn follows). Its prompt is a separate
  sequence whatever ``drift`` says: the earlier tokens stay trained as generated, none is
  invented or cut (counted in ``history_rewrites``, not as drift).
- **one sequence** (``one_sequence=True``, with ``drift="realign"``): engines that train one
  sequence per trajectory (verl) get every call chained into one: a call that would start a
  new sequence is realigned like drift, so policy tokens of earlier calls that its prompt no
  longer holds are dropped from training (counted in ``realign_dropped_tokens``).

Nothing is ever re-tokenised: every token comes from a record. A completion generated under
a grammar keeps it as a `GrammarSpan`, and one sampled with top-k or top-p keeps them as a
`TruncationSpan`, so that the learner scores its tokens under the same distribution
(``logprobs.policy_logprobs``).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, TypeVar

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.records import CallRecord
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.rollout.types import RolloutResultResponse
from osmosis_ai.train.algorithm._record_numbers import checked_numbers

__all__ = [
    "DriftPolicy",
    "Exclusion",
    "GrammarSpan",
    "RolloutRecords",
    "SequenceStats",
    "TrainingSequence",
    "TruncationSpan",
    "build_sequences",
]

DriftPolicy = Literal["fork", "realign"]


class Exclusion(StrEnum):
    """Why a rollout gives no training sequence."""

    FAILED = "failed"
    """The rollout did not succeed (failure, cancellation, timeout...)."""
    REMOVED = "removed"
    """The grader set ``remove_sample`` (or the result carries no sample)."""
    NO_REWARD = "no_reward"
    """A kept sample without a reward."""
    NO_CALLS = "no_calls"
    """The rollout made no successful model call."""
    NO_TOKEN_IDS = "no_token_ids"
    """A call's record has no prompt token ids (a policy that does not return them)."""
    BAD_LOGPROBS = "bad_logprobs"
    """A call's logprobs are missing or do not match its completion tokens one to one."""
    NON_FINITE_LOGPROBS = "non_finite_logprobs"
    """A call's logprob is NaN or infinite (an engine fault): one such token would make the
    whole step's loss NaN, so the rollout is left out and the step goes on."""
    NO_POLICY_TOKENS = "no_policy_tokens"
    """Every completion was empty: nothing to train."""


@dataclass(frozen=True, slots=True)
class RolloutRecords:
    """What the trainer knows about one finished rollout."""

    result: RolloutResultResponse
    """The rollout server's final result (status, sample, reward, ``remove_sample``)."""
    group_id: str
    """The dataset row it was sampled for: advantages are normalised within a group."""
    calls: Sequence[CallRecord | Mapping[str, Any]]
    """Its gateway call records, as objects or in their JSON form (``CallRecord.to_json``)."""


@dataclass(frozen=True, slots=True)
class GrammarSpan:
    """Policy tokens ``start..end - 1`` of a sequence, one completion generated under a
    grammar (from its first token on)."""

    start: int
    end: int
    grammar: str
    """The grammar's Lark text, as the engine compiled it."""


@dataclass(frozen=True, slots=True)
class TruncationSpan:
    """Policy tokens ``start..end - 1`` of a sequence, one completion sampled from a
    distribution cut to its ``top_k`` most likely tokens (0: no cut), then to the most likely
    ones whose probability reaches ``top_p`` (1: no cut)."""

    start: int
    end: int
    top_k: int
    top_p: float


_Span = TypeVar("_Span", GrammarSpan, TruncationSpan)


@dataclass(frozen=True, slots=True)
class TrainingSequence:
    """One token sequence to train on, with its loss mask and behaviour logprobs."""

    rollout_id: str
    group_id: str
    reward: float
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    """1 on tokens the policy generated, 0 on context (prompt, tool results, template)."""
    behaviour_logprobs: tuple[float, ...]
    """Logprob the sampling policy gave each token; 0.0 where the mask is 0."""
    grammar_spans: tuple[GrammarSpan, ...] = ()
    """The completions generated under a grammar."""
    truncation_spans: tuple[TruncationSpan, ...] = ()
    """The completions sampled with top-k or top-p."""
    versions: tuple[int, ...] = ()
    """The weight version that generated each of its completions, in order (a rollout may
    span versions under asynchronous training); empty when the records carry none."""
    truncated: bool = False
    """A model call of its rollout stopped at its token limit (finish reason ``length``)."""
    longest_completion: int = 0
    """The most tokens one model call of its rollout generated."""
    turn_starts: tuple[tuple[int, int], ...] = ()
    """Where each of its completions starts, with the index of the model call (turn) that
    wrote it: ``(position, call index)``, in order."""
    turn_rewards: tuple[tuple[int, float], ...] = ()
    """Its rollout's turn rewards, ``(call index, reward)`` by index (the sample's
    ``turn_rewards``): credit per turn (``advantages.turn_advantages``)."""

    def __post_init__(self) -> None:
        lengths = {len(self.token_ids), len(self.loss_mask), len(self.behaviour_logprobs)}
        if len(lengths) != 1:
            raise ConfigError(
                f"sequence of rollout {self.rollout_id!r}: token_ids, loss_mask and "
                "behaviour_logprobs must have the same length"
            )

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def policy_tokens(self) -> int:
        """How many tokens carry loss."""
        return sum(self.loss_mask)

    @property
    def oldest_version(self) -> int | None:
        """The oldest weight version among its completions (``None``: not recorded)."""
        return min(self.versions, default=None)


@dataclass(slots=True)
class SequenceStats:
    """Counts of one batch of rollouts turned into sequences."""

    rollouts: int = 0
    rollouts_used: int = 0
    excluded: Counter[str] = field(default_factory=Counter)
    """Excluded rollouts by ``Exclusion`` value."""
    groups: int = 0
    groups_without_sequences: int = 0
    """Groups where no rollout gave a sequence (e.g. every rollout failed)."""
    calls: int = 0
    failed_calls: int = 0
    """Calls that ended in an error: skipped, they produced no tokens."""
    merges: int = 0
    drift: int = 0
    """Transitions where re-tokenisation broke the prefix (forked or realigned)."""
    realign_dropped_tokens: int = 0
    """Policy tokens cut from training by ``drift="realign"``."""
    new_contexts: int = 0
    """Calls that started a separate sequence because their history was not a prefix."""
    history_rewrites: int = 0
    """Calls that started a separate sequence (or, with ``one_sequence``, were realigned)
    because the chat template rendered an earlier call otherwise in their prompt."""
    sequences: int = 0
    tokens: int = 0
    policy_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        """The counts as JSON-ready data (for a metrics line)."""
        return {
            "rollouts": self.rollouts,
            "rollouts_used": self.rollouts_used,
            "excluded": dict(sorted(self.excluded.items())),
            "groups": self.groups,
            "groups_without_sequences": self.groups_without_sequences,
            "calls": self.calls,
            "failed_calls": self.failed_calls,
            "merges": self.merges,
            "drift": self.drift,
            "realign_dropped_tokens": self.realign_dropped_tokens,
            "new_contexts": self.new_contexts,
            "history_rewrites": self.history_rewrites,
            "sequences": self.sequences,
            "tokens": self.tokens,
            "policy_tokens": self.policy_tokens,
        }


@dataclass(frozen=True, slots=True)
class _CallTokens:
    prompt: list[int]
    completion: list[int]
    logprobs: list[float]
    grammar: str | None = None
    version: int | None = None
    top_k: int = 0
    top_p: float = 1.0
    finish_reason: str | None = None
    index: int = 0
    history_rewritten: bool = False


@dataclass(slots=True)
class _Building:
    """A sequence being chained, and where its last completion starts."""

    tokens: list[int]
    mask: list[int]
    logprobs: list[float]
    last_completion_start: int
    spans: list[GrammarSpan] = field(default_factory=list)
    cuts: list[TruncationSpan] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """Each completion's weight version, with where it starts."""
    version_starts: list[int] = field(default_factory=list)
    turn_starts: list[tuple[int, int]] = field(default_factory=list)

    def append(self, tokens: Sequence[int], *, policy: Sequence[float] | None) -> None:
        self.tokens.extend(tokens)
        self.mask.extend([0 if policy is None else 1] * len(tokens))
        self.logprobs.extend([0.0] * len(tokens) if policy is None else policy)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` tokens (and the spans' parts among them)."""
        del self.tokens[length:], self.mask[length:], self.logprobs[length:]
        kept = sum(1 for start in self.version_starts if start < length)
        del self.versions[kept:], self.version_starts[kept:]
        self.turn_starts = [turn for turn in self.turn_starts if turn[0] < length]
        self.spans = _within(self.spans, length)
        self.cuts = _within(self.cuts, length)


def _within(spans: list[_Span], length: int) -> list[_Span]:
    """The parts of ``spans`` before token ``length``."""
    return [
        dataclasses.replace(span, end=min(span.end, length))
        for span in spans
        if span.start < length
    ]


def build_sequences(
    rollouts: Iterable[RolloutRecords],
    *,
    drift: DriftPolicy = "fork",
    one_sequence: bool = False,
) -> tuple[list[TrainingSequence], SequenceStats]:
    """Turn finished rollouts into training sequences, counting what was merged or left out.

    Args:
        rollouts: Finished rollouts with their call records.
        drift: What to do when re-tokenisation breaks a prefix (see the module docstring).
        one_sequence: At most one sequence per rollout: calls that do not chain are
            realigned into it (needs ``drift="realign"``); each such call counts as drift.

    Raises:
        ConfigError: An unknown ``drift`` policy, ``one_sequence`` with ``drift="fork"``, or
            a call record in JSON form whose fields have the wrong type.
    """
    if drift not in ("fork", "realign"):
        raise ConfigError(f"drift must be 'fork' or 'realign', not {drift!r}")
    if one_sequence and drift != "realign":
        raise ConfigError(
            "one_sequence=True realigns every call into one sequence; pass drift='realign'"
        )
    stats = SequenceStats()
    sequences: list[TrainingSequence] = []
    groups: dict[str, int] = {}
    for rollout in rollouts:
        stats.rollouts += 1
        group = rollout.group_id
        groups.setdefault(group, 0)
        built = _rollout_sequences(rollout, drift, stats, one_sequence=one_sequence)
        if isinstance(built, Exclusion):
            stats.excluded[built.value] += 1
            continue
        stats.rollouts_used += 1
        groups[group] += len(built)
        sequences.extend(built)
    stats.groups = len(groups)
    stats.groups_without_sequences = sum(1 for count in groups.values() if count == 0)
    stats.sequences = len(sequences)
    stats.tokens = sum(len(sequence) for sequence in sequences)
    stats.policy_tokens = sum(sequence.policy_tokens for sequence in sequences)
    return sequences, stats


def _rollout_sequences(
    rollout: RolloutRecords, drift: DriftPolicy, stats: SequenceStats, *, one_sequence: bool
) -> list[TrainingSequence] | Exclusion:
    result = rollout.result
    if result.status is not RolloutStatus.SUCCESS:
        return Exclusion.FAILED
    if result.sample is None or result.sample.remove_sample:
        return Exclusion.REMOVED
    if result.sample.reward is None:
        return Exclusion.NO_REWARD
    calls: list[_CallTokens] = []
    for call in sorted(rollout.calls, key=_index):
        stats.calls += 1
        tokens = _call_tokens(call, result.rollout_id, _index(call))
        if tokens is None:
            stats.failed_calls += 1
        elif isinstance(tokens, Exclusion):
            return tokens
        else:
            calls.append(tokens)
    if not calls:
        return Exclusion.NO_CALLS
    chained = _chain(calls, drift, stats, one_sequence=one_sequence)
    if not any(1 in building.mask for building in chained):
        return Exclusion.NO_POLICY_TOKENS
    reward = float(result.sample.reward)
    truncated = any(call.finish_reason == "length" for call in calls)
    longest = max(len(call.completion) for call in calls)
    turn_rewards = tuple(sorted(result.sample.turn_rewards.items()))
    return [
        TrainingSequence(
            rollout_id=result.rollout_id,
            group_id=rollout.group_id,
            reward=reward,
            token_ids=tuple(building.tokens),
            loss_mask=tuple(building.mask),
            behaviour_logprobs=tuple(building.logprobs),
            grammar_spans=tuple(building.spans),
            truncation_spans=tuple(building.cuts),
            versions=tuple(building.versions),
            truncated=truncated,
            longest_completion=longest,
            turn_starts=tuple(building.turn_starts),
            turn_rewards=turn_rewards,
        )
        for building in chained
        if 1 in building.mask
    ]


def _chain(
    calls: list[_CallTokens], drift: DriftPolicy, stats: SequenceStats, *, one_sequence: bool
) -> list[_Building]:
    chained: list[_Building] = []
    for call in calls:
        # The sequence this call most plausibly continues: the longest shared prefix (the
        # latest on ties, so interleaved conversations each keep their own sequence).
        best: _Building | None = None
        shared = -1
        for building in chained:
            common = _common_prefix(building.tokens, call.prompt)
            if common >= shared:
                best, shared = building, common
        if best is not None and shared == len(best.tokens):
            stats.merges += 1
            best.append(call.prompt[shared:], policy=None)
        elif best is not None and (
            call.history_rewritten
            or one_sequence
            or best.last_completion_start <= shared < len(call.prompt)
        ):
            # A rewrite is the template's doing, not drift: realigned only into one_sequence.
            if call.history_rewritten:
                stats.history_rewrites += 1
            else:
                stats.drift += 1
            if drift == "realign" and (one_sequence or not call.history_rewritten):
                stats.realign_dropped_tokens += sum(best.mask[shared:])
                best.truncate(shared)
                best.append(call.prompt[shared:], policy=None)
            else:
                best = None
        else:
            if best is not None:
                stats.new_contexts += 1
            best = None
        if best is None:
            best = _Building([], [], [], 0)
            best.append(call.prompt, policy=None)
            chained.append(best)
        start = best.last_completion_start = len(best.tokens)
        best.append(call.completion, policy=call.logprobs)
        if call.grammar is not None and call.completion:
            best.spans.append(GrammarSpan(start, len(best.tokens), call.grammar))
        if (call.top_k > 0 or call.top_p < 1) and call.completion:
            best.cuts.append(TruncationSpan(start, len(best.tokens), call.top_k, call.top_p))
        if call.version is not None and call.completion:
            best.versions.append(call.version)
            best.version_starts.append(start)
        if call.completion:
            best.turn_starts.append((start, call.index))
    return chained


def _common_prefix(left: list[int], right: list[int]) -> int:
    length = min(len(left), len(right))
    if left[:length] == right[:length]:  # the usual case, compared at C speed
        return length
    for position in range(length):
        if left[position] != right[position]:
            return position
    return length


def _index(call: CallRecord | Mapping[str, Any]) -> int:
    index = call.index if isinstance(call, CallRecord) else call.get("index", 0)
    return index if isinstance(index, int) else 0


def _call_tokens(
    call: CallRecord | Mapping[str, Any], rollout_id: str, index: int
) -> _CallTokens | Exclusion | None:
    """The call's tokens, ``None`` for a failed call, or why the rollout cannot be trained."""
    if isinstance(call, CallRecord):
        status: object = call.status
        prompt: object = call.prompt_token_ids
        completion: object = call.completion_token_ids
        logprobs: object = call.logprobs
        grammar: object = call.grammar
        version: object = call.policy_version
        top_k: object = call.top_k
        top_p: object = call.top_p
        finish: object = call.finish_reason
        rewritten: object = call.history_rewritten
    else:
        status = call.get("status", "ok")
        prompt = call.get("prompt_token_ids")
        completion = call.get("completion_token_ids")
        logprobs = call.get("logprobs")
        grammar = call.get("grammar")
        version = call.get("policy_version")
        top_k = call.get("top_k")
        top_p = call.get("top_p")
        finish = call.get("finish_reason")
        rewritten = call.get("history_rewritten", False)
    if status == "error":
        return None
    if prompt is None:
        return Exclusion.NO_TOKEN_IDS
    prompt_ids = checked_numbers(
        prompt, floats=False, name="prompt_token_ids", rollout_id=rollout_id
    )
    if not prompt_ids:
        return Exclusion.NO_TOKEN_IDS
    # A record stores an empty completion (and its logprobs) as null.
    completion_ids = checked_numbers(
        completion or [], floats=False, name="completion_token_ids", rollout_id=rollout_id
    )
    completion_logprobs = checked_numbers(
        logprobs or [], floats=True, name="logprobs", rollout_id=rollout_id
    )
    if len(completion_logprobs) != len(completion_ids):
        return Exclusion.BAD_LOGPROBS
    if not all(math.isfinite(value) for value in completion_logprobs):
        return Exclusion.NON_FINITE_LOGPROBS
    if grammar is not None and not isinstance(grammar, str):
        raise ConfigError(
            f"call record of rollout {rollout_id!r}: 'grammar' must be a string (a Lark "
            "grammar) or null"
        )
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise ConfigError(
            f"call record of rollout {rollout_id!r}: 'policy_version' must be an integer or null"
        )
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise ConfigError(
            f"call record of rollout {rollout_id!r}: 'top_k' must be an integer of at least 0 "
            "or null"
        )
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0 < top_p <= 1
    ):
        raise ConfigError(
            f"call record of rollout {rollout_id!r}: 'top_p' must be a number in (0, 1] or null"
        )
    return _CallTokens(
        prompt=prompt_ids,
        completion=completion_ids,
        logprobs=[float(value) for value in completion_logprobs],
        grammar=grammar,
        version=version,
        top_k=top_k or 0,
        top_p=1.0 if top_p is None else float(top_p),
        finish_reason=finish if isinstance(finish, str) else None,
        index=index,
        history_rewritten=rewritten is True,
    )
