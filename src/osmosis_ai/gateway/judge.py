"""``Judge``: the model a run's judges ask, served apart from the policy.

A rollout's grader reaches it at ``<rollout url>/judge/chat/completions`` (with the rollout's
key); the controller's group judge calls it in-process. Its answers are never recorded as
the rollout's calls, so no judge token is trained on. It has its own concurrency limit,
per-call timeout and retries, caches answers by request within the run (the same rubric and
trajectory are judged once), and counts its calls, tokens and seconds.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from osmosis_ai.errors import ChatRequestError, JudgeError, PolicyError
from osmosis_ai.gateway.policies.base import Policy
from osmosis_ai.gateway.request import ChatRequest, parse_chat_request
from osmosis_ai.redact import redact_text
from osmosis_ai.rollout.judge import (
    answer_tokens,
    group_judge_messages,
    group_verdict_format,
    parse_group_verdict,
    reply_text,
)

__all__ = ["Judge", "JudgeUsage"]

logger = logging.getLogger(__name__)

#: Answers kept for the run: enough for every rollout of a long run's recent steps.
_CACHE_SIZE = 4096


@dataclass
class JudgeUsage:
    """What a run's judge did, cumulatively."""

    calls: int = 0
    """Answers the judge model computed."""
    cache_hits: int = 0
    """Requests answered from the run's cache (or by a call already in flight)."""
    retries: int = 0
    """Calls tried again after a timeout or an upstream failure."""
    failures: int = 0
    """Requests that failed after every try."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    """Seconds of the judge's calls, summed (calls in parallel each count)."""

    def metrics(self) -> dict[str, float]:
        """The counts as ``judge_<name>`` metrics."""
        return {f"judge_{name}": round(float(value), 3) for name, value in asdict(self).items()}

    def since(self, earlier: JudgeUsage) -> JudgeUsage:
        """What was done after ``earlier`` (a `copy` of this usage then)."""
        now, before = asdict(self), asdict(earlier)
        return JudgeUsage(**{name: now[name] - before[name] for name in now})

    def copy(self) -> JudgeUsage:
        """These counts as they are now."""
        return JudgeUsage(**asdict(self))

    def line(self) -> str:
        """The counts in one line, as a run says them."""
        return (
            f"{self.calls} calls ({self.cache_hits} answered from the cache, {self.retries} "
            f"retried, {self.failures} failed), {self.prompt_tokens} prompt and "
            f"{self.completion_tokens} completion tokens, {self.seconds:.1f} s"
        )


def _cache_key(body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _retryable(exc: BaseException) -> bool:
    # A request the model refuses will be refused again; a timeout or a server error may not.
    if isinstance(exc, TimeoutError):
        return True
    return isinstance(exc, PolicyError) and exc.status_code >= 500


class Judge:
    """The judge model of a run, with its limits.

    Args:
        policy: What answers (any policy the gateway serves; started by the gateway).
        label: How the judge is named in messages (no credentials).
        concurrency: Calls in flight at most.
        timeout_sec: Bound of one call.
        retries: Further tries of a call that timed out or failed upstream.
        max_tokens: Tokens an answer may take when the request names none.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        label: str,
        concurrency: int = 4,
        timeout_sec: float = 45.0,
        retries: int = 2,
        max_tokens: int = 400,
    ) -> None:
        self.policy = policy
        self.label = label
        self.timeout_sec = timeout_sec
        self.retries = retries
        self.max_tokens = max_tokens
        self.usage = JudgeUsage()
        self._slots = asyncio.Semaphore(concurrency)
        self._cache: OrderedDict[str, asyncio.Future[dict[str, Any]]] = OrderedDict()

    def request(self, payload: object) -> ChatRequest:
        """``payload`` (a chat-completions body) as the judge is asked it: whole, at
        temperature 0 unless it says otherwise.

        Raises:
            ChatRequestError: Not a chat-completions body, or a streamed one.
        """
        chat = parse_chat_request(payload)
        if chat.stream:
            raise ChatRequestError(
                "the judge answers whole replies; send stream: false", param="stream"
            )
        chat.body.setdefault("temperature", 0.0)
        if "max_completion_tokens" not in chat.body:
            chat.body.setdefault("max_tokens", self.max_tokens)
        return chat

    async def complete(self, chat: ChatRequest) -> dict[str, Any]:
        """The judge's answer to ``chat``, from the cache when the same request was asked.

        Raises:
            JudgeError: Every try failed or timed out (the last failure's message).
            ChatRequestError: The judge model refused the request.
        """
        key = _cache_key(chat.body)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self.usage.cache_hits += 1
            return copy.deepcopy(await asyncio.shield(cached))
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._cache[key] = future
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        try:
            answer = await self._answer(chat)
        except BaseException as exc:
            self._cache.pop(key, None)  # a failure is not remembered: a later ask tries again
            if isinstance(exc, asyncio.CancelledError):
                future.cancel()
            else:
                future.set_exception(exc)
                future.exception()  # retrieved: waiters re-raise it, nobody else needs to
            raise
        future.set_result(answer)
        return copy.deepcopy(answer)

    async def _answer(self, chat: ChatRequest) -> dict[str, Any]:
        async with self._slots:
            for attempt in range(self.retries + 1):
                started = time.perf_counter()
                try:
                    async with asyncio.timeout(self.timeout_sec):
                        answer = await self.policy.complete(chat)
                except Exception as exc:
                    self.usage.seconds += time.perf_counter() - started
                    if isinstance(exc, ChatRequestError):
                        self.usage.failures += 1
                        raise
                    if not _retryable(exc) or attempt == self.retries:
                        self.usage.failures += 1
                        raise JudgeError(self._failure(exc, attempt + 1)) from None
                    self.usage.retries += 1
                    logger.warning("judge call failed, trying again: %s", self._failure(exc, 1))
                    continue
                self._count(answer, time.perf_counter() - started)
                return answer
        raise AssertionError("unreachable: the last try returns or raises")

    def _failure(self, exc: BaseException, tries: int) -> str:
        what = (
            f"timed out after {self.timeout_sec:g} s"
            if isinstance(exc, TimeoutError)
            else f"failed: {redact_text(str(exc), secrets=self.policy.secrets())}"
        )
        after = f" (after {tries} tries)" if tries > 1 else ""
        return f"the judge {self.label} {what}{after}"

    def _count(self, answer: Mapping[str, Any], seconds: float) -> None:
        prompt, completion = answer_tokens(answer)
        self.usage.calls += 1
        self.usage.seconds += seconds
        self.usage.prompt_tokens += prompt
        self.usage.completion_tokens += completion

    async def score_group(
        self,
        rubric: str,
        trajectories: Sequence[Sequence[Mapping[str, Any]]],
        *,
        reference: str | None,
        low: float,
        high: float,
        choices: Sequence[float] | None = None,
    ) -> tuple[list[float], str]:
        """One call that scores a group's trajectories against each other.

        Raises:
            JudgeError: The call failed, or its answer holds no valid score per trajectory.
        """
        payload = {
            "messages": group_judge_messages(
                rubric, trajectories, reference=reference, low=low, high=high, choices=choices
            ),
            "response_format": group_verdict_format(len(trajectories), low, high, choices),
        }
        try:
            answer = await self.complete(self.request(payload))
        except ChatRequestError as exc:
            raise JudgeError(f"the judge {self.label} refused the request: {exc}") from None
        return parse_group_verdict(reply_text(answer), len(trajectories), low, high, choices)
