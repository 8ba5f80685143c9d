"""On-policy distillation's per-token advantages (pure Python, no torch).

The student samples; a teacher scores each sampled token in the context the student saw
(`logprobs.sequence_logprobs`); the token's advantage is ``weight × (log π_teacher − log
π_student)``, the negative of the per-token reverse KL estimate, with the reward's advantage
added at ``reward_weight``. A token the teacher finds likelier than the student did is
pushed up, one it finds less likely pushed down: the student moves toward the teacher on
its own trajectories (Agarwal et al. 2024, GKD; the on-policy distillation write-ups of
Thinking Machines, 2025, and Qwen3's technical report).

The student's logprobs are the behaviour logprobs its engine recorded when it sampled (the
torch engine's are the learner's, fp32). The teacher's are taken as the learner scores:
under the sampling temperature, the grammar a token was generated under and its top-k/top-p
cut, so the two distributions compared are the same kind. Each sequence is a rollout's exact
token history, so every completion is scored in its own context, turn by turn.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from osmosis_ai.train.algorithm.sequences import TrainingSequence

__all__ = ["distill_advantages", "reverse_kl"]


def distill_advantages(
    sequences: Sequence[TrainingSequence],
    outcome: Sequence[float | tuple[float, ...]],
    teacher: Sequence[Sequence[float]],
    *,
    weight: float,
    reward_weight: float,
) -> list[tuple[float, ...]]:
    """Each sequence's advantage per token: ``reward_weight`` × its ``outcome`` advantage
    (one per sequence, or one per token under credit per turn), plus on each policy token
    ``weight × (teacher − behaviour)``, where ``teacher`` holds the teacher's logprob of
    each token of the sequence (any value off the loss mask)."""
    out: list[tuple[float, ...]] = []
    for sequence, base, scored in zip(sequences, outcome, teacher, strict=True):
        if len(scored) != len(sequence):
            raise ValueError(
                f"teacher logprobs of rollout {sequence.rollout_id!r}: {len(scored)} for a "
                f"sequence of {len(sequence)} tokens"
            )
        bases = [float(base)] * len(sequence) if isinstance(base, int | float) else list(base)
        out.append(
            tuple(
                reward_weight * b + (weight * (t - s) if on else 0.0)
                for b, t, s, on in zip(
                    bases, scored, sequence.behaviour_logprobs, sequence.loss_mask, strict=True
                )
            )
        )
    return out


def reverse_kl(sequences: Sequence[TrainingSequence], teacher: Sequence[Sequence[float]]) -> float:
    """The mean over the policy tokens of ``behaviour − teacher``: the per-token estimate of
    the reverse KL from the student to the teacher on the student's own samples (0.0 when
    no token carries loss)."""
    gaps = [
        s - t
        for sequence, scored in zip(sequences, teacher, strict=True)
        for s, t, on in zip(sequence.behaviour_logprobs, scored, sequence.loss_mask, strict=True)
        if on
    ]
    return statistics.fmean(gaps) if gaps else 0.0
