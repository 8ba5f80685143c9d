"""A distillation teacher served elsewhere: a vLLM (or other OpenAI-compatible) server that
returns prompt logprobs for a prompt of token ids (``[algorithm.distill] teacher =
"openai:<base_url>[:<model>]"``). A teacher in a local directory is loaded by the learner
instead (`core.Learner.teacher`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx2

from osmosis_ai.errors import ConfigError
from osmosis_ai.train.algorithm.sequences import TrainingSequence

__all__ = ["ServerTeacher", "TeacherServerError"]

#: Text whose ids the server and the student's tokenizer must agree on.
_PROBE = 'Teacher and student: 17 * 23 = 391 <tool_call> {"name": "calculator"} éà 中文'
_KEY = "algorithm.distill.teacher"


class TeacherServerError(ConfigError):
    """The teacher's server could not be used: unreachable, an error, or another tokenizer."""


class ServerTeacher:
    """Scores sequences with a server's prompt logprobs (``POST <base>/completions`` with the
    sequence's ids as the prompt, ``max_tokens`` 1 and ``prompt_logprobs`` 0, as vLLM takes
    them), ``concurrency`` sequences at a time.

    The server's prompt logprobs are of its unscaled distribution (vLLM's are), with no
    grammar mask or top-k/top-p cut: an exact reverse KL needs rollouts sampled at
    temperature 1 without a cut.
    """

    def __init__(self, base_url: str, model: str | None, *, concurrency: int = 8) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.concurrency = concurrency

    @staticmethod
    async def _post(http: httpx2.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = await http.post(url, json=body)
        except httpx2.HTTPError as exc:
            raise TeacherServerError(f"{_KEY}: could not reach {url}: {exc}") from None
        if response.status_code != 200:
            raise TeacherServerError(
                f"{_KEY}: {url} answered {response.status_code}: {response.text[:300]}"
            )
        answer: dict[str, Any] = response.json()
        return answer

    async def check(self, tokenizer: Any) -> None:
        """Refuse a server whose tokenizer is not the student's (its ``/tokenize`` of a probe
        text must give the student's ids).

        Raises:
            TeacherServerError: It has no ``/tokenize``, or its ids differ.
        """
        root = self.base_url.removesuffix("/v1")
        body = {"prompt": _PROBE, "add_special_tokens": False, **self._named()}
        async with httpx2.AsyncClient(timeout=60) as http:
            answer = await self._post(http, f"{root}/tokenize", body)
        theirs = answer.get("tokens")
        ours = tokenizer.encode(_PROBE, add_special_tokens=False)
        if theirs != ours:
            raise TeacherServerError(
                f"{_KEY} {self.base_url}: its tokenizer is not the student's (a probe text "
                f"is {len(theirs or [])} tokens there, {len(ours)} here, or other ids); the "
                "teacher scores the student's token ids, so serve a teacher of the same family"
            )

    def _named(self) -> dict[str, str]:
        return {"model": self.model} if self.model else {}

    async def logprobs(self, sequences: Sequence[TrainingSequence]) -> list[tuple[float, ...]]:
        """Each sequence's logprob per token from the server (0.0 at its first token)."""
        slots = asyncio.Semaphore(self.concurrency)
        async with httpx2.AsyncClient(timeout=600) as http:
            scored = await asyncio.gather(*(self._scored(http, slots, s) for s in sequences))
        return list(scored)

    async def _scored(
        self, http: httpx2.AsyncClient, slots: asyncio.Semaphore, sequence: TrainingSequence
    ) -> tuple[float, ...]:
        body = {
            "prompt": list(sequence.token_ids),
            "max_tokens": 1,
            "prompt_logprobs": 0,
            "temperature": 1.0,
            **self._named(),
        }
        async with slots:
            answer = await self._post(http, f"{self.base_url}/completions", body)
        try:
            entries = answer["choices"][0]["prompt_logprobs"]
            values = [0.0] + [
                float(entry[str(token)]["logprob"])
                for entry, token in zip(entries[1:], sequence.token_ids[1:], strict=True)
            ]
        except (KeyError, IndexError, TypeError, ValueError):
            raise TeacherServerError(
                f"{_KEY} {self.base_url}: the answer has no prompt logprob for each token of "
                "the prompt (a vLLM server answers them to prompt_logprobs)"
            ) from None
        return tuple(values)
