"""Model judges: a rubric, a model, and a score in a declared range.

`JudgeGrader` grades one sample by asking a judge model; the run that drives the rollout
serves that model on the rollout's own judge endpoint (``<rollout url>/judge``: `osmosis
eval` and `osmosis train` with a ``[judge]`` section), apart from the policy, so the judge's
tokens never become the policy's training data. The prompts and the parsing of verdicts are
pure functions here, shared with the group judge the controller runs over a group's samples.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from osmosis_ai.errors import GradingError, JudgeError
from osmosis_ai.rollout.config import GraderConfig
from osmosis_ai.rollout.context import GraderContext, get_rollout_context
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.model_pool import tls_context

__all__ = [
    "JUDGE_ROUTE",
    "JudgeGrader",
    "JudgeGraderConfig",
    "Verdict",
    "answer_tokens",
    "group_judge_messages",
    "group_verdict_format",
    "judge_messages",
    "parse_group_verdict",
    "parse_verdict",
    "reference_of",
    "render_trajectory",
    "reply_text",
    "score_range",
    "usage_metrics",
    "verdict_format",
    "write_verdict",
]

#: Where a rollout's judge is served, under the rollout's base URL (the model endpoint).
JUDGE_ROUTE = "judge"
#: Characters of one message a judge is shown; the rest is elided (a judge's context is finite).
_MAX_CONTENT = 4000
#: Characters of reasoning a verdict may hold (bounded in the schema, so a grammar ends it).
_MAX_REASONING = 600
_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


@dataclass(frozen=True)
class Verdict:
    """A judge's answer for one trajectory."""

    score: float
    reasoning: str


def _text_of(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):  # content parts: the text ones
        text = "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    else:
        text = json.dumps(content, default=str)
    if len(text) > _MAX_CONTENT:
        return text[:_MAX_CONTENT] + f" [... {len(text) - _MAX_CONTENT} characters elided]"
    return text


def render_trajectory(messages: Sequence[Mapping[str, Any]]) -> str:
    """A conversation as the plain transcript a judge reads: one block per message, tool
    calls with their arguments, tool results with their tool's name."""
    names: dict[str, str] = {}
    blocks: list[str] = []
    for message in messages:
        role = str(message.get("role", "?"))
        text = _text_of(message.get("content"))
        if role == "tool":
            name = names.get(str(message.get("tool_call_id")), "tool")
            blocks.append(f"[tool result: {name}]\n{text}")
            continue
        if text:
            blocks.append(f"[{role}]\n{text}")
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            name = str(function.get("name", "?"))
            names[str(call.get("id"))] = name
            blocks.append(f"[{role} calls {name}]\n{_text_of(function.get('arguments'))}")
    return "\n\n".join(blocks)


def _final_answer(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "assistant" and _text_of(message.get("content")):
            return _text_of(message.get("content"))
    return "(none: the agent gave no final answer)"


def _scale_of(low: float, high: float, choices: Sequence[float] | None) -> str:
    if choices:
        return "one of " + ", ".join(f"{c:g}" for c in choices) + f" ({high:g} is best)"
    return f"a number from {low:g} (worst) to {high:g} (best)"


def _reference_block(reference: str | None) -> str:
    return "" if reference is None else f"# Reference answer\n{reference}\n\n"


def judge_messages(
    rubric: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    reference: str | None,
    low: float,
    high: float,
    choices: Sequence[float] | None = None,
) -> list[dict[str, str]]:
    """The chat a judge answers to grade one trajectory by ``rubric`` (with a score among
    ``choices`` when given)."""
    system = (
        "You grade the work of an AI agent by a rubric. Read the rubric, the reference answer "
        "if there is one, and the agent's trajectory. Answer with one JSON object: "
        f'{{"reasoning": "<why, briefly>", "score": <{_scale_of(low, high, choices)}>}}.'
    )
    user = (
        f"# Rubric\n{rubric}\n\n{_reference_block(reference)}"
        f"# Trajectory\n{render_trajectory(messages)}\n\n"
        f"# Final answer\n{_final_answer(messages)}"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def group_judge_messages(
    rubric: str,
    trajectories: Sequence[Sequence[Mapping[str, Any]]],
    *,
    reference: str | None,
    low: float,
    high: float,
    choices: Sequence[float] | None = None,
) -> list[dict[str, str]]:
    """The chat a judge answers to score a group's trajectories against each other (one
    task, several attempts: RULER-style relative scores)."""
    count = len(trajectories)
    system = (
        f"You compare {count} attempts of AI agents at the same task, by a rubric. Score each "
        "attempt relative to the others: a better attempt gets a higher score. Answer with one "
        'JSON object: {"reasoning": "<why, briefly>", "scores": [<one score per attempt, in '
        f"order: {_scale_of(low, high, choices)}>]}}."
    )
    attempts = "\n\n".join(
        f"## Attempt {index + 1}\n{render_trajectory(messages)}\n\n"
        f"Final answer of attempt {index + 1}: {_final_answer(messages)}"
        for index, messages in enumerate(trajectories)
    )
    user = f"# Rubric\n{rubric}\n\n{_reference_block(reference)}# Attempts\n{attempts}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _score_schema(
    low: float, high: float, choices: Sequence[float] | None = None
) -> dict[str, Any]:
    # An enum is what every structured-output engine enforces (llama.cpp's grammars bound
    # integers only, not numbers).
    if choices:
        return {"enum": list(choices)}
    return {"type": "number", "minimum": low, "maximum": high}


def _response_format(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    schema = {
        "type": "object",
        # The reasoning comes first, so the model reasons before it scores.
        "properties": {
            "reasoning": {"type": "string", "maxLength": _MAX_REASONING},
            **properties,
        },
        "required": ["reasoning", *properties],
        "additionalProperties": False,
    }
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def verdict_format(
    low: float, high: float, choices: Sequence[float] | None = None
) -> dict[str, Any]:
    """The ``response_format`` of a verdict: its reasoning, then its score (one of
    ``choices`` when given)."""
    return _response_format("verdict", {"score": _score_schema(low, high, choices)})


def group_verdict_format(
    count: int, low: float, high: float, choices: Sequence[float] | None = None
) -> dict[str, Any]:
    """The ``response_format`` of a group verdict: its reasoning, then ``count`` scores (each
    one of ``choices`` when given)."""
    scores = {
        "type": "array",
        "items": _score_schema(low, high, choices),
        "minItems": count,
        "maxItems": count,
    }
    return _response_format("group_verdict", {"scores": scores})


def _answer_object(text: str) -> dict[str, Any]:
    """The JSON object of a judge's answer (also inside a code fence or prose)."""
    for candidate in (text, *(_JSON_OBJECT.findall(text) or ())):
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    raise JudgeError(f"the judge's answer is no JSON object: {_excerpt(text)}")


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= 200 else flat[:200] + "...")


def _checked_score(
    value: object, low: float, high: float, what: str, choices: Sequence[float] | None = None
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise JudgeError(f"the judge's {what} is not a number: {value!r}")
    if not low <= value <= high:
        raise JudgeError(f"the judge's {what} {value:g} is outside its range [{low:g}, {high:g}]")
    if choices and value not in choices:
        allowed = ", ".join(f"{choice:g}" for choice in choices)
        raise JudgeError(f"the judge's {what} {value:g} is not one of its scores ({allowed})")
    return float(value)


def _reasoning(answer: Mapping[str, Any]) -> str:
    reasoning = answer.get("reasoning", "")
    return reasoning if isinstance(reasoning, str) else json.dumps(reasoning, default=str)


def parse_verdict(
    text: str, low: float, high: float, choices: Sequence[float] | None = None
) -> Verdict:
    """A judge's answer as a `Verdict`.

    Raises:
        JudgeError: No JSON object, or no numeric ``score`` within ``[low, high]`` (and among
            ``choices`` when given).
    """
    answer = _answer_object(text)
    if "score" not in answer:
        raise JudgeError(f"the judge's answer has no score: {_excerpt(text)}")
    score = _checked_score(answer["score"], low, high, "score", choices)
    return Verdict(score, _reasoning(answer))


def parse_group_verdict(
    text: str, count: int, low: float, high: float, choices: Sequence[float] | None = None
) -> tuple[list[float], str]:
    """A group judge's answer: ``count`` scores in order (each one of ``choices`` when given),
    and its reasoning.

    Raises:
        JudgeError: No JSON object, or no list of ``count`` numbers within ``[low, high]``.
    """
    answer = _answer_object(text)
    scores = answer.get("scores")
    if not isinstance(scores, list) or len(scores) != count:
        raise JudgeError(
            f"the group judge's answer has no list of {count} scores: {_excerpt(text)}"
        )
    checked = [
        _checked_score(score, low, high, f"score of attempt {index + 1}", choices)
        for index, score in enumerate(scores)
    ]
    return checked, _reasoning(answer)


def score_range(
    scores: Sequence[float] | None, min_score: float, max_score: float
) -> tuple[float, float]:
    """The worst and best score a judge may give: the extremes of its allowed ``scores``
    (sorted), else ``min_score`` and ``max_score``."""
    return (scores[0], scores[-1]) if scores else (min_score, max_score)


class JudgeGraderConfig(GraderConfig):
    """What a `JudgeGrader` asks, and of which model."""

    name: str = "judge"

    rubric: str = Field(min_length=1)
    """What a good trajectory is, in words the judge reads."""

    min_score: float = Field(default=0.0, allow_inf_nan=False)
    """The worst score; the reward is the judge's score itself."""

    max_score: float = Field(default=1.0, allow_inf_nan=False)
    """The best score."""

    scores: tuple[float, ...] | None = None
    """The only scores the judge may give (``(0, 1)``: fail or pass; ``(1, 2, 3, 4, 5)``),
    asked as an enum, which every structured-output engine enforces (a small model asked for
    a number in a range may answer 28); they replace ``min_score`` and ``max_score``.
    ``None``: any number in the range."""

    reference: str | None = "label"
    """What the judge is given as the reference answer: ``"label"`` (the row's ground
    truth), ``"metadata.<key>"`` (a field of the row's metadata), or ``None`` (nothing)."""

    max_tokens: int = Field(default=400, ge=16)
    """Tokens the judge may write (its reasoning is capped at 600 characters)."""

    base_url: str | None = None
    """An OpenAI-compatible base URL to ask instead of the rollout's judge endpoint (a
    rollout server driven by another trainer, which serves no judge)."""

    model: str = "judge"
    """The model named in each request (the rollout's judge endpoint serves its own)."""

    api_key_env: str | None = None
    """The environment variable holding ``base_url``'s key (never written anywhere)."""

    @field_validator("scores")
    @classmethod
    def _distinct_scores(cls, scores: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if scores is None:
            return None
        if len(set(scores)) < 2 or not all(math.isfinite(score) for score in scores):
            raise ValueError("scores must hold at least two different finite numbers")
        return tuple(sorted(set(scores)))

    @property
    def low(self) -> float:
        """The worst score (`score_range`)."""
        return score_range(self.scores, self.min_score, self.max_score)[0]

    @property
    def high(self) -> float:
        """The best score (`score_range`)."""
        return score_range(self.scores, self.min_score, self.max_score)[1]

    @model_validator(mode="after")
    def _ordered_range(self) -> JudgeGraderConfig:
        if self.min_score >= self.max_score:
            raise ValueError(
                f"min_score ({self.min_score:g}) must be below max_score ({self.max_score:g})"
            )
        if self.reference not in (None, "label") and not (
            self.reference.startswith("metadata.") and len(self.reference) > len("metadata.")
        ):
            raise ValueError(f'reference {self.reference!r}: use "label", "metadata.<key>" or None')
        return self


def reference_of(reference: str | None, ctx: GraderContext) -> str | None:
    """The reference answer ``reference`` names in the row ``ctx`` grades.

    Raises:
        GradingError: The row has no such value.
    """
    if reference is None:
        return None
    if reference == "label":
        if ctx.label is None:
            raise GradingError(
                "the judge's reference is the row's label, and this row has none: give rows a "
                "ground_truth, or set the grader's reference to None"
            )
        return ctx.label
    key = reference.removeprefix("metadata.")
    value = (ctx.metadata or {}).get(key)
    if value is None:
        raise GradingError(
            f"the judge's reference is the row's metadata {key!r}, and this row has none"
        )
    return value if isinstance(value, str) else json.dumps(value, default=str)


class _Endpoint:
    """Where and with which key a judge is asked."""

    def __init__(self, config: JudgeGraderConfig) -> None:
        if config.base_url is not None:
            self.url = config.base_url.rstrip("/") + "/chat/completions"
            key = os.environ.get(config.api_key_env) if config.api_key_env else None
            if config.api_key_env and not key:
                raise GradingError(
                    f"the judge's key variable {config.api_key_env} is not set in the rollout "
                    "server's environment"
                )
        else:
            rollout = get_rollout_context()
            if rollout is None or not rollout.chat_completions_url:
                raise GradingError(
                    "a JudgeGrader outside a rollout needs a base_url (inside one, it asks the "
                    "rollout's judge endpoint)"
                )
            self.url = f"{rollout.chat_completions_url}/{JUDGE_ROUTE}/chat/completions"
            key = rollout.api_key
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def ask(self, body: dict[str, Any]) -> dict[str, Any]:
        """The judge's answer to ``body`` (the grader's deadline bounds the wait).

        Raises:
            JudgeError: The judge could not be reached or answered an error.
        """
        import httpx2  # here: importing the rollout package loads no HTTP client

        try:
            async with httpx2.AsyncClient(timeout=None, verify=tls_context()) as http:
                response = await http.post(self.url, json=body, headers=self.headers)
        except httpx2.HTTPError as exc:
            raise JudgeError(f"could not reach the judge at {self.url}: {exc}") from None
        if response.status_code != 200:
            raise JudgeError(
                f"the judge at {self.url} answered {response.status_code}: "
                f"{_error_message(response)}"
            )
        try:
            answer: dict[str, Any] = response.json()
        except ValueError:
            raise JudgeError(f"the judge at {self.url} answered no JSON") from None
        return answer


def _error_message(response: Any) -> str:
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message) if message else _excerpt(response.text)


def reply_text(answer: Mapping[str, Any]) -> str:
    """The text of a chat completion's first choice.

    Raises:
        JudgeError: The answer holds no text.
    """
    try:
        content = answer["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        content = None
    if not isinstance(content, str) or not content.strip():
        raise JudgeError("the judge answered no text")
    return content


def answer_tokens(answer: Mapping[str, Any]) -> tuple[int, int]:
    """The prompt and completion tokens a chat completion's usage reports (0 if none)."""
    usage = answer.get("usage")
    if not isinstance(usage, Mapping):
        return 0, 0
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def usage_metrics(answer: Mapping[str, Any], seconds: float) -> dict[str, float]:
    """A judge call's tokens and time, as sample metrics."""
    prompt, completion = answer_tokens(answer)
    return {
        "judge_seconds": round(seconds, 3),
        "judge_prompt_tokens": float(prompt),
        "judge_completion_tokens": float(completion),
    }


class JudgeGrader(Grader):
    """Rewards a sample with a judge model's score of its trajectory by a rubric.

    The judge sees the conversation (messages, tool calls and results, the final answer),
    the rubric and, by default, the row's label as the reference answer, and answers a JSON
    verdict (structured output where its endpoint supports it). The reward is the score;
    the verdict is kept in the sample (``metrics["judge_score"]``, its tokens and seconds;
    ``extra_fields["judge"]`` with the reasoning, which the viewer shows with the grade) and
    as ``judge.json`` among the rollout's artifacts. A judge that fails, times out or answers
    no valid score fails the rollout with ``judge_error``, never a silent 0.

    Example:
        ```python
        backend = LocalBackend(
            workflow=MyWorkflow,
            grader=JudgeGrader,
            grader_config=JudgeGraderConfig(rubric="Is the answer correct and justified?"),
        )
        ```
    """

    config: JudgeGraderConfig

    def __init__(self, config: JudgeGraderConfig | None = None) -> None:
        if not isinstance(config, JudgeGraderConfig):
            raise GradingError("a JudgeGrader needs a JudgeGraderConfig (its rubric)")
        super().__init__(config)

    async def grade(self, ctx: GraderContext) -> None:
        """Ask the judge and reward the sample with its score."""
        assert ctx.sample is not None
        config = self.config
        endpoint = _Endpoint(config)
        body = {
            "model": config.model,
            "messages": judge_messages(
                config.rubric,
                ctx.sample.messages,
                reference=reference_of(config.reference, ctx),
                low=config.low,
                high=config.high,
                choices=config.scores,
            ),
            "temperature": 0.0,
            "max_tokens": config.max_tokens,
            "response_format": verdict_format(config.low, config.high, config.scores),
        }
        started = time.perf_counter()
        answer = await endpoint.ask(body)
        verdict = parse_verdict(reply_text(answer), config.low, config.high, config.scores)
        ctx.sample.metrics = {
            **ctx.sample.metrics,
            "judge_score": verdict.score,
            **usage_metrics(answer, time.perf_counter() - started),
        }
        record = {
            "score": verdict.score,
            "range": [config.low, config.high],
            "reasoning": verdict.reasoning,
        }
        ctx.sample.extra_fields = {**ctx.sample.extra_fields, "judge": record}
        if ctx.artifacts_dir is not None:
            await asyncio.to_thread(write_verdict, ctx.artifacts_dir / "judge.json", record)
        ctx.set_reward(verdict.score)


def write_verdict(path: Path, verdict: Mapping[str, object]) -> None:
    """Write a judge's verdict as ``path`` (a JSON file beside a rollout's other files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(verdict, indent=2) + "\n")
