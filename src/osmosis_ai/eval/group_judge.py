"""The group judge: one call scores a group's rollouts against each other, and the scores
become their rewards. `osmosis eval` calls it once per row (its runs), `osmosis train` once
per group (a row's ``group_size`` rollouts)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from osmosis_ai.config.judge import JudgeConfig
from osmosis_ai.errors import JudgeError
from osmosis_ai.eval.run_dir import GROUP_JUDGE_FILE
from osmosis_ai.gateway import Judge
from osmosis_ai.rollout.judge import write_verdict
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus
from osmosis_ai.rollout.types import RolloutResultResponse

__all__ = ["group_judging", "judge_group"]


def group_judging(judge: Judge | None, config: JudgeConfig | None) -> bool:
    """Whether a run with this served judge and ``[judge]`` scores its groups."""
    return judge is not None and config is not None and config.group_rubric is not None


def _judged(result: RolloutResultResponse) -> bool:
    sample = result.sample
    return (
        result.status is RolloutStatus.SUCCESS
        and result.err_message is None
        and sample is not None
        and not sample.remove_sample
    )


async def judge_group(
    judge: Judge,
    config: JudgeConfig,
    results: Sequence[RolloutResultResponse],
    *,
    label: str | None,
    files: Path,
) -> list[RolloutResultResponse]:
    """``results`` (one group, in order) with the group judge's scores as the rewards of its
    successful, kept rollouts; the others are returned as they are.

    Each judged rollout keeps its grader's reward as the ``grader_reward`` metric (when it
    had one), gets ``group_judge_score``, and its verdict (its score, the group's reasoning)
    is written to ``files/<rollout_id>/group_judge.json``. A judge that fails fails every
    rollout it was to score with ``judge_error``: no rollout is trained on a reward it did
    not get.
    """
    assert config.group_rubric is not None
    judged = [index for index, result in enumerate(results) if _judged(result)]
    if not judged:
        return list(results)
    samples = [results[index].sample for index in judged]
    try:
        scores, reasoning = await judge.score_group(
            config.group_rubric,
            [sample.messages for sample in samples if sample is not None],
            reference=label if config.group_reference else None,
            low=config.low,
            high=config.high,
            choices=config.scores,
        )
    except JudgeError as exc:
        failed = {
            "status": RolloutStatus.FAILURE,
            "err_category": RolloutErrorCategory.JUDGE_ERROR,
            "err_message": f"group judge: {exc}",
        }
        return [
            result.model_copy(update=failed) if index in judged else result
            for index, result in enumerate(results)
        ]
    out = list(results)
    for rank, (index, score) in enumerate(zip(judged, scores, strict=True)):
        result = results[index]
        sample = result.sample
        assert sample is not None
        verdict = {
            "score": score,
            "range": [config.low, config.high],
            "attempt": rank + 1,
            "of": len(judged),
            "reasoning": reasoning,
        }
        metrics = {**sample.metrics, "group_judge_score": score}
        if sample.reward is not None:
            metrics["grader_reward"] = sample.reward
        judged_sample = sample.model_copy(update={"reward": score, "metrics": metrics})
        out[index] = result.model_copy(update={"sample": judged_sample})
        path = files / result.rollout_id / GROUP_JUDGE_FILE
        await asyncio.to_thread(write_verdict, path, verdict)
    return out
