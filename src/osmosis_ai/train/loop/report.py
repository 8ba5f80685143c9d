"""What a step did (`StepReport`), and the forms it is written in: its ``metrics.jsonl`` line
(which the CLI prints and the trackers get as scalars) and its journal record."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from osmosis_ai.eval.metrics import passes
from osmosis_ai.train.loop.admission import staleness_stats
from osmosis_ai.train.loop.batch import StepBatch
from osmosis_ai.train.loop.rollouts import rollout_reward, rollout_status

if TYPE_CHECKING:
    from osmosis_ai.train.algorithm.sequences import RolloutRecords
    from osmosis_ai.train.algorithm.update import StepMetrics

__all__ = ["StepReport", "StepTimes", "step_seconds"]

#: The line's keys taken from the update's `StepMetrics` (``None`` when no update ran).
_FROM_UPDATE = (
    "loss", "kl", "clip_fraction", "approx_kl", "entropy", "mean_ratio", "engine_mismatch_kl",
    "dual_clip_fraction", "tis_capped_fraction", "tis_masked_fraction", "constrained_fraction",
    "grad_norm",
)  # fmt: skip
_STEP_TIMES = ("generation_sec", "sequences_sec", "update_sec")


def step_seconds(line: dict[str, Any]) -> float:
    """A step's time as ``max_minutes`` counts it, from its line: rollouts, sequences and the
    update (held-out evaluations and checkpoints are not counted)."""
    return sum(float(line.get(key) or 0) for key in _STEP_TIMES)


@dataclass(frozen=True)
class StepTimes:
    """Seconds of a step's phases, from its start."""

    generation: float
    """Until its rollouts were in (resampled groups included)."""
    sequences: float
    update: float
    """The update, the weight push and the probe."""
    weight_sync: float
    policy_busy: float
    """The engine's generating time during the step."""
    learner_busy: float
    """The learner thread's: the update, and generation when the torch engine shares it."""

    @property
    def wall(self) -> float:
        return self.generation + self.sequences + self.update


@dataclass(frozen=True)
class StepReport:
    """One step: its rollouts, its batch, its update (or why there was none), its times."""

    step: int
    done: list[RolloutRecords]
    batch: StepBatch
    metrics: StepMetrics | None
    no_update: str | None
    times: StepTimes
    pass_threshold: float
    tokens_generated: int
    resampled_groups: int
    groups_waited: int
    probe_gap: float | None
    memory: dict[str, float]
    signals: dict[str, float | None] = field(default_factory=dict)
    """The models beside the policy: the judge's ``judge_*`` counts over the step (calls,
    cache hits, tokens, seconds) and the teacher's ``teacher_reverse_kl`` (the mean over the
    step's trained tokens of the student's logprob minus the teacher's) and ``teacher_sec``;
    empty without a judge or a teacher."""

    @property
    def rollout_ids(self) -> list[str]:
        return sorted(r.result.rollout_id for r in self.done)

    def journal_record(self) -> dict[str, Any]:
        """The journal's ``step`` line: the rollouts it trained on (a resumed run trains none
        of them again) and, for a step that changed no weight, why."""
        record: dict[str, Any] = {"event": "step", "step": self.step, "rollouts": self.rollout_ids}
        if self.no_update:
            record["no_update"] = self.no_update
        return record

    def line(self) -> dict[str, Any]:
        """The step's ``metrics.jsonl`` line."""
        rewards = [x for x in (rollout_reward(r.result) for r in self.done) if x is not None]
        passed = [
            passes(rollout_status(r.result), rollout_reward(r.result), self.pass_threshold)
            for r in self.done
        ]
        stale_mean, stale_max = staleness_stats(self.step, self.batch.versions)
        metrics, stats, times = self.metrics, self.batch.stats, self.times
        return {
            "step": self.step,
            "reward_mean": statistics.fmean(rewards) if rewards else None,
            "reward_std": statistics.pstdev(rewards) if rewards else None,
            "pass_rate": sum(passed) / len(passed),
            **{key: getattr(metrics, key) if metrics else None for key in _FROM_UPDATE},
            # By update number (a table, so that trackers get clip_fraction_by_update/N).
            "clip_fraction_by_update": (
                {str(n): f for n, f in enumerate(metrics.clip_fraction_by_update, 1)}
                if metrics
                else None
            ),
            "updates": metrics.updates if metrics else 0,
            "no_update": self.no_update,
            "importance_ratio_max": metrics.max_ratio if metrics else None,
            "tokens_generated": self.tokens_generated,
            "tokens_trained": metrics.policy_tokens if metrics else 0,
            "tokens_forwarded": metrics.tokens if metrics else 0,
            "tokens_computed": metrics.computed_tokens if metrics else 0,
            "tokens_per_sec": (
                self.tokens_generated / times.generation if times.generation > 0 else None
            ),
            "generation_sec": round(times.generation, 3),
            "policy_busy_sec": round(times.policy_busy, 3),
            "sequences_sec": round(times.sequences, 3),
            "update_sec": round(times.update, 3),
            "weight_sync_sec": round(times.weight_sync, 3),
            "probe_gap": self.probe_gap,
            "staleness_mean": stale_mean,
            "staleness_max": stale_max,
            "groups_waited": self.groups_waited,
            # The consumer waits for rollouts from the step's start until they are all in.
            "rollout_wait_fraction": _share(times.generation, times.wall),
            "learner_idle_fraction": _idle(times.learner_busy, times.wall),
            "generator_idle_fraction": _idle(times.policy_busy, times.wall),
            "drift": stats.drift,
            "new_contexts": stats.new_contexts,
            "history_rewrites": stats.history_rewrites,
            "merges": stats.merges,
            "sequences": stats.sequences,
            "excluded": dict(stats.excluded),
            "zero_gradient_groups": len(self.batch.zero_gradient),
            "resampled_groups": self.resampled_groups,
            "groups_without_sequences": stats.groups_without_sequences,
            **self.memory,
            **self.signals,
        }


def _share(part_sec: float, wall_sec: float) -> float | None:
    """``part_sec`` as a share of the step's wall time (``None`` for an instant step)."""
    if wall_sec <= 0:
        return None
    return round(min(1.0, max(0.0, part_sec / wall_sec)), 4)


def _idle(busy_sec: float, wall_sec: float) -> float | None:
    """The share of the step's wall time not spent busy."""
    busy = _share(busy_sec, wall_sec)
    return None if busy is None else round(1 - busy, 4)
