"""``osmosis train run``: GRPO on the user's workflow and grader, served from live weights.

Each step picks rows (seeded by the step, so a resumed run picks the same ones), runs
``group_size`` rollouts per row through the rollout server, turns the gateway's call records
into sequences and applies one update inside the token engine's ``updating()`` (no model
call runs while the weights change), then pushes the new weights to the engine. The
gateway serves an `EnginePolicy`: a `ChatFront` on that engine. The run directory
``.osmosis/train/<run>/`` holds:

- ``events.jsonl``: the journal (``start``, ``step``, ``eval``, ``checkpoint``, ``resume``,
  ``stopped``); the last ``checkpoint`` line is the last step a resume starts after, and a
  resume drops the ``step`` and ``eval`` lines after it (those steps run again, and are
  journaled once);
- ``metrics.jsonl``: one line per applied step (rewound the same way);
- ``rollouts.jsonl``: one line per finished rollout (status, reward, tokens, error);
- ``checkpoints/step-NNNN/``: weights (``save_pretrained``; the adapter under LoRA),
  tokenizer and ``trainer.pt`` (optimizer, scheduler, RNG states, step), each renamed into
  place whole (the newest ``keep_checkpoints`` are kept), and ``checkpoints/latest``, a link
  to the newest;
- ``rollouts/``: every rollout's files (ATIF trajectories), the server's artifact root.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import dataclasses
import json
import logging
import os
import random
import shutil
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from secrets import token_urlsafe
from typing import Any, Protocol

from osmosis_ai.errors import ConfigError, OsmosisError
from osmosis_ai.eval.datasets import DatasetItem, load_dataset
from osmosis_ai.eval.metrics import pass_at_k, passes
from osmosis_ai.eval.prepare import secret_values
from osmosis_ai.eval.run_dir import check_run_name, run_lock, run_log
from osmosis_ai.eval.server_process import RolloutServerProcess
from osmosis_ai.eval.stack import RolloutStack, RolloutStackError, rollout_stack
from osmosis_ai.gateway.policies._hf_dir import (
    import_llguidance,
    import_peft,
    import_torch_stack,
    quiet_transformers,
)
from osmosis_ai.gateway.policies._torch_device import is_out_of_memory, resolve_device
from osmosis_ai.gateway.policies.chat_front import ChatFront
from osmosis_ai.gateway.policies.engine_policy import EnginePolicy
from osmosis_ai.gateway.policies.engines.vllm import VllmEngineError
from osmosis_ai.gateway.records import CallRecord
from osmosis_ai.redact import Redactor, credential_env_values
from osmosis_ai.rollout._scrub import scrub_files
from osmosis_ai.rollout.server.app import BACKEND_ENV, SECRET_ENV_NAMES_ENV, parse_backend_spec
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.rollout.types import RolloutResultResponse
from osmosis_ai.train.config import TrainConfig, load_train_config
from osmosis_ai.train.generation import Generator, open_generator
from osmosis_ai.train.learner import Learner, checkpoint_steps
from osmosis_ai.train.model import resolve_model
from osmosis_ai.train.sequences import RolloutRecords, TrainingSequence, build_sequences
from osmosis_ai.train.trackers import (
    TrackedRun,
    TrackerError,
    Trackers,
    check_trackers,
    open_trackers,
    scalars,
)

__all__ = [
    "LATEST_CHECKPOINT",
    "EvalPoint",
    "FlatStepsHint",
    "QuietHooks",
    "TrainHooks",
    "TrainOptions",
    "TrainOutcome",
    "TrainingStopped",
    "held_out_pass_at_k",
    "out_of_memory",
    "run_training",
    "split_rows",
    "step_rows",
    "step_seconds",
]

_FEATURE = "osmosis train"
_ROLLOUT_DEADLINE_SEC = 900.0
#: Rollouts in flight at least; a step's rollouts are all in flight at once, so the engine
#: generates their calls together.
_MIN_IN_FLIGHT = 16
#: ``checkpoints/<this>`` links to the newest checkpoint.
LATEST_CHECKPOINT = "latest"
_STEP_TIMES = ("generation_sec", "sequences_sec", "update_sec")


class TrainingStopped(OsmosisError):
    """The run stopped before its last step; the message names the step and how to resume.

    ``outcome`` is what the run did until then (its held-out evaluations), when it got as
    far as starting the loop.
    """

    def __init__(self, message: str, outcome: TrainOutcome | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome


def out_of_memory(exc: BaseException, *, step: int, token_budget: int) -> TrainingStopped | None:
    """The stop to raise when ``exc`` is an allocation failure of the update (on any
    device), else None."""
    if not is_out_of_memory(exc):
        return None
    return TrainingStopped(
        f"out of memory in the update of step {step}; lower [training] token_budget "
        f"(now {token_budget}) so each micro-batch of the update holds fewer tokens"
    )


@dataclass(frozen=True)
class TrainOptions:
    """What ``osmosis train run`` was asked to do."""

    config_path: Path
    overrides: tuple[str, ...] = ()
    """``section.key=value`` settings that replace the file's (``--set``)."""
    name: str | None = None
    fresh: bool = False
    """Delete the run directory first instead of resuming it."""
    backend: str = "local"
    """Where rollouts run, as ``osmosis eval run --backend`` (local, process, ray...)."""


@dataclass(frozen=True)
class EvalPoint:
    """A held-out evaluation after ``step`` applied steps."""

    step: int
    pass_rate: float
    mean_reward: float
    pass_at_k: dict[int, float] = field(default_factory=dict)
    """pass@1..k when ``eval_samples`` is k > 1 (empty for one sample per row)."""

    def to_json(self) -> dict[str, Any]:
        """The journal's ``eval`` line."""
        line: dict[str, Any] = {
            "event": "eval",
            "step": self.step,
            "pass_rate": self.pass_rate,
            "mean_reward": self.mean_reward,
        }
        if self.pass_at_k:
            line["pass_at_k"] = {str(k): value for k, value in self.pass_at_k.items()}
        return line

    @classmethod
    def from_json(cls, line: Mapping[str, Any]) -> EvalPoint:
        """The point of a journal's ``eval`` line."""
        return cls(
            int(line["step"]),
            float(line["pass_rate"]),
            float(line["mean_reward"]),
            {int(k): float(v) for k, v in (line.get("pass_at_k") or {}).items()},
        )

    def scalars(self) -> dict[str, float]:
        """What the trackers get: ``eval/pass_rate``, ``eval/mean_reward``, ``eval/pass@k``."""
        values = {"eval/pass_rate": self.pass_rate, "eval/mean_reward": self.mean_reward}
        values.update({f"eval/pass@{k}": value for k, value in self.pass_at_k.items()})
        return values


@dataclass
class TrainOutcome:
    """How the run ended."""

    run_dir: Path
    steps_done: int = 0
    evals: list[EvalPoint] = field(default_factory=list)


class TrainHooks(Protocol):
    """What the CLI hears as the run goes."""

    def message(self, text: str) -> None:
        """A progress message."""

    def started(self, first_step: int, last_step: int) -> None:
        """The loop runs steps ``first_step``..``last_step`` (a resumed run starts later)."""

    def step_done(self, metrics: Mapping[str, Any]) -> None:
        """One applied step's metrics line."""

    def eval_done(self, point: EvalPoint) -> None:
        """A held-out evaluation finished."""


class QuietHooks:
    """Hooks that say nothing (library use)."""

    def message(self, text: str) -> None:
        pass

    def started(self, first_step: int, last_step: int) -> None:
        pass

    def step_done(self, metrics: Mapping[str, Any]) -> None:
        pass

    def eval_done(self, point: EvalPoint) -> None:
        pass


def _append(path: Path, data: Mapping[str, Any]) -> None:
    """One JSON line, flushed to disk before returning (a crash keeps whole lines)."""
    with path.open("a", encoding="utf-8") as file:
        file.write(json.dumps(data, sort_keys=True) + "\n")
        file.flush()
        os.fsync(file.fileno())


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    # A line cut by a crash mid-write is the only one that may not parse: the last.
    parsed = []
    for index, line in enumerate(lines):
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            if index != len(lines) - 1:
                raise
    return parsed


def _dataset_rows(config: TrainConfig) -> tuple[list[DatasetItem], list[int], list[int]]:
    """The rows (training rows, then held-out ones from ``eval_dataset``), and the indices
    of each part: with no ``eval_dataset``, a seeded split of ``dataset`` (blocking)."""
    items = load_dataset(config.dataset).items
    if config.eval_dataset is None:
        return items, *split_rows(len(items), config.training.eval_rows, config.training.seed)
    held = load_dataset(config.eval_dataset).items
    everything = [*items, *held]
    return everything, list(range(len(items))), list(range(len(items), len(everything)))


def split_rows(count: int, eval_rows: float, seed: int) -> tuple[list[int], list[int]]:
    """``(train, held_out)`` row indices: a seeded shuffle, the held-out part first."""
    held = int(eval_rows) if eval_rows >= 1 else max(1, round(eval_rows * count))
    if held >= count:
        raise ConfigError(
            f"training.eval_rows holds out {held} of the dataset's {count} rows, leaving none "
            "to train on; lower eval_rows or add rows"
        )
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return sorted(order[held:]), sorted(order[:held])


def step_rows(train_rows: Sequence[int], per_step: int, seed: int, step: int) -> list[int]:
    """The rows of ``step``: a function of the seed and the step only, so resume repeats it."""
    chooser = random.Random(f"{seed}:{step}")
    return chooser.sample(list(train_rows), min(per_step, len(train_rows)))


@dataclass
class _Run:
    config: TrainConfig
    run_dir: Path
    items: list[DatasetItem]
    generator: Generator
    stack: RolloutStack
    log: logging.Logger
    hooks: TrainHooks
    redactor: Redactor
    trackers: Trackers
    semaphore: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        training = self.config.training
        step_rollouts = training.prompts_per_step * training.group_size
        self.semaphore = asyncio.Semaphore(max(_MIN_IN_FLIGHT, step_rollouts))

    async def rollout(self, row: int, rollout_id: str) -> RolloutRecords:
        """One rollout of ``row``, graded, with its call records (taken from the gateway)."""
        item, gateway = self.items[row], self.stack.gateway
        async with self.semaphore:
            handle = await self.stack.client.run_rollout(
                item.prompt,
                gateway.chat_completions_url(rollout_id),
                rollout_id,
                llm_api_key=gateway.token,
                label=item.label,
                metadata=item.metadata,
                extra_fields={"trajectory_report_url": gateway.trajectory_report_url(rollout_id)},
            )
            async with asyncio.timeout(_ROLLOUT_DEADLINE_SEC):
                result = await handle
        calls = gateway.records.calls(rollout_id)
        gateway.records.release(rollout_id)
        # The rollout's files (trajectory, artifacts) may quote the key or a secret.
        secrets = self.redactor.secrets
        await asyncio.to_thread(scrub_files, self.run_dir / "rollouts" / rollout_id, secrets)
        line = _rollout_line(rollout_id, row, result, calls, self.redactor)
        await asyncio.to_thread(_append, self.run_dir / "rollouts.jsonl", line)
        return RolloutRecords(result=result, group_id=_group_id(row), calls=calls)

    async def rollouts(self, jobs: list[tuple[int, str]]) -> list[RolloutRecords]:
        """All of ``jobs`` at once (the policy batches their calls).

        Raises:
            TrainingStopped: The server died (its rollouts' results are then failures that
                say nothing about the policy) or a rollout could not be run.
        """
        server = self.stack.server
        exited: asyncio.Future[Any] = asyncio.ensure_future(server.wait())
        engine_died: asyncio.Future[None] = asyncio.ensure_future(self.generator.died())
        running: asyncio.Future[Any] = asyncio.gather(
            *(self.rollout(row, rid) for row, rid in jobs)
        )
        try:
            await asyncio.wait((running, exited, engine_died), return_when=asyncio.FIRST_COMPLETED)
            if exited.done() or server.exited:
                raise TrainingStopped(f"the rollout server exited with status {server.returncode}")
            if self.generator.lost:  # its calls failed: the rollouts say nothing
                raise TrainingStopped(await self.generator.why_lost())
            done: list[RolloutRecords] = await running
            if self.generator.engine.out_of_memory:  # its calls failed: the rollouts say nothing
                raise TrainingStopped(
                    "out of memory generating the rollouts; lower [training] max_tokens (now "
                    f"{self.config.training.max_tokens}) so each call's cache holds fewer tokens"
                )
            return done
        except (OsmosisError, OSError, TimeoutError) as exc:
            if isinstance(exc, TrainingStopped):
                raise
            # The server stopped answering: the step's rollouts are incomplete.
            raise TrainingStopped(
                f"a rollout could not finish ({exc or type(exc).__name__})"
            ) from None
        finally:
            for task in (running, exited, engine_died):
                task.cancel()
            await asyncio.gather(running, exited, engine_died, return_exceptions=True)

    async def evaluate(self, step: int, held_out: list[int]) -> EvalPoint:
        """Pass rate and mean reward of ``eval_samples`` rollouts per held-out row, sampled at
        ``eval_temperature`` (greedy by default, so that two points compare policies, not
        luck); with several samples, pass@1..k as ``osmosis eval`` estimates it."""
        gateway, training = self.stack.gateway, self.config.training
        samples = training.eval_samples
        jobs = [
            (row, f"eval-{step:04d}-row-{row}" + (f"-{index}" if samples > 1 else ""))
            for row in held_out
            for index in range(samples)
        ]
        sampling = gateway.sampling
        gateway.sampling = {**sampling, "temperature": training.eval_temperature}
        try:
            done = await self.rollouts(jobs)
        finally:
            gateway.sampling = sampling
        rewards = [_reward(r.result) for r in done]
        threshold = training.pass_threshold
        passed = [
            passes(_status(r.result), reward, threshold)
            for r, reward in zip(done, rewards, strict=True)
        ]
        point = EvalPoint(
            step,
            sum(passed) / len(passed),
            statistics.fmean(x or 0.0 for x in rewards),
            held_out_pass_at_k(passed, samples) if samples > 1 else {},
        )
        await asyncio.to_thread(_append, self.run_dir / "events.jsonl", point.to_json())
        await asyncio.to_thread(self.trackers.log, point.scalars(), step)
        self.hooks.eval_done(point)
        return point


def held_out_pass_at_k(passed: Sequence[bool], samples: int) -> dict[int, float]:
    """pass@1..``samples`` of outcomes listed row by row, ``samples`` per row: the mean over
    the rows of the unbiased estimate (`pass_at_k`)."""
    rows = [passed[start : start + samples] for start in range(0, len(passed), samples)]
    return {
        k: statistics.fmean(pass_at_k(samples, sum(row), k) for row in rows)
        for k in range(1, samples + 1)
    }


def _reward(result: RolloutResultResponse) -> float | None:
    sample = result.sample
    return sample.reward if sample is not None and result.status is RolloutStatus.SUCCESS else None


def _status(result: RolloutResultResponse) -> str:
    if result.status is not RolloutStatus.SUCCESS:
        return "failed"
    return "skipped" if result.sample is not None and result.sample.remove_sample else "success"


def _rollout_line(
    rollout_id: str,
    row: int,
    result: RolloutResultResponse,
    calls: Sequence[CallRecord],
    redactor: Redactor,
) -> dict[str, Any]:
    """A finished rollout's line of ``rollouts.jsonl`` (what the viewer lists per step)."""
    failed = result.status is not RolloutStatus.SUCCESS
    return {
        "rollout_id": rollout_id,
        "row": row,
        "status": _status(result),
        "reward": _reward(result),
        "tokens": sum(int((call.usage or {}).get("total_tokens") or 0) for call in calls),
        # The weight versions its calls were generated with (the steps applied before).
        "policy_versions": sorted({c.policy_version for c in calls} - {None}),
        "error_type": (result.err_category.value if result.err_category else None)
        if failed
        else None,
        "error_message": redactor.text(result.err_message) if result.err_message else None,
    }


def _last_checkpoint(events: list[dict[str, Any]]) -> int:
    steps = [int(e["step"]) for e in events if e.get("event") == "checkpoint"]
    return max(steps, default=0)


def _checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:04d}"


def step_seconds(metrics: dict[str, Any]) -> float:
    """A step's time as ``max_minutes`` counts it: rollouts, sequences and the update
    (held-out evaluations and checkpoints are not counted)."""
    return sum(float(metrics.get(key) or 0) for key in _STEP_TIMES)


def _rewind(run_dir: Path, step: int) -> None:
    """Drop metrics, step and eval lines after checkpoint ``step``: those steps run again.

    So each step (and each evaluation) appears once, however often the run was killed.
    """
    _rewrite(run_dir / "metrics.jsonl", lambda line: int(line["step"]) <= step)
    _rewrite(
        run_dir / "events.jsonl",
        lambda line: line.get("event") not in ("step", "eval") or int(line["step"]) <= step,
    )


def _rewrite(path: Path, keep: Callable[[dict[str, Any]], bool]) -> None:
    """Keep the lines of ``path`` that ``keep`` accepts (a whole new file renamed into place)."""
    if not path.exists():
        return
    kept = [line for line in _read_lines(path) if keep(line)]
    temp = path.with_name(path.name + ".tmp")
    temp.write_text("".join(json.dumps(x, sort_keys=True) + "\n" for x in kept), encoding="utf-8")
    os.replace(temp, path)


def _group_id(row: int) -> str:
    return f"row-{row}"


def _jobs(prefix: str, rows: list[int], size: int) -> list[tuple[int, str]]:
    """``size`` rollouts of each row, with run-unique rollout ids under ``prefix``."""
    return [(r, f"{prefix}-row-{r}-{k}") for r in rows for k in range(size)]


@dataclass
class _Sampled:
    """A step's rollouts after dynamic sampling."""

    done: list[RolloutRecords]
    """The rollouts the step trains on (a resampled group's last attempt)."""
    resampled: int
    """Group re-runs done (a group run again twice counts twice)."""
    dropped_tokens: int
    """Policy tokens generated by the attempts that were run again."""


async def _sample(run: _Run, step: int, rows: list[int]) -> _Sampled:
    """The step's rollouts; groups with all-equal rewards run again, up to the configured bound."""
    from osmosis_ai.train.grpo import zero_gradient_groups

    training = run.config.training
    size = training.group_size
    sampled = _Sampled(await run.rollouts(_jobs(f"step-{step:04d}", rows, size)), 0, 0)
    for attempt in range(1, training.resample_zero_gradient + 1):
        zero = zero_gradient_groups(build_sequences(sampled.done, drift="fork")[0])
        if not zero:
            break
        again = [r for r in rows if _group_id(r) in zero]
        fresh = await run.rollouts(_jobs(f"step-{step:04d}-resample-{attempt}", again, size))
        dropped = [d for d in sampled.done if d.group_id in zero]
        sampled.dropped_tokens += build_sequences(dropped, drift="fork")[1].policy_tokens
        sampled.done = [d for d in sampled.done if d.group_id not in zero] + fresh
        sampled.resampled += len(again)
    return sampled


def _check_budget(sequences: list[TrainingSequence], step: int, budget: int) -> None:
    """Refuse a sequence no micro-batch can hold, naming the config keys (``train_step``
    would name its own parameter, which the user never wrote)."""
    longest = max((len(sequence) for sequence in sequences), default=0)
    if longest > budget:
        raise TrainingStopped(
            f"a sequence of step {step} has {longest} tokens, more than [training] token_budget "
            f"({budget}); raise token_budget or lower max_tokens"
        )


async def _step(run: _Run, learner: Learner, train_rows: list[int], step: int) -> dict[str, Any]:
    """Run one step's rollouts and apply its update; returns the step's metrics line.

    Raises:
        TrainingStopped: The rollouts could not finish, or the update ran out of memory.
        NonFiniteStepError: The update's loss or gradient is not finite.
    """
    from osmosis_ai.train.grpo import train_step, zero_gradient_groups

    training = run.config.training
    rows = step_rows(train_rows, training.prompts_per_step, training.seed, step)
    started, busy = time.monotonic(), run.generator.engine.busy_sec
    sampled = await _sample(run, step, rows)
    done = sampled.done
    generated = time.monotonic()
    sequences, stats = build_sequences(done, drift="fork")
    zero = zero_gradient_groups(sequences)
    trained = [s for s in sequences if s.group_id not in zero]
    _check_budget(trained, step, training.token_budget)
    built = time.monotonic()
    metrics = None
    sync_sec = 0.0
    if trained:
        # No model call runs while the optimizer changes the weights the engine serves.
        async with run.generator.engine.updating(version=step) as update:
            try:
                # Generation's freed buffers go before the update allocates (and the update's
                # after it, below), so neither phase holds memory only the other could reuse.
                await learner.run(_return_freed_memory, learner.device)
                metrics = await learner.run(
                    train_step,
                    learner.model,
                    learner.optimizer,
                    trained,
                    learner.grpo,
                    step=step,
                    reference_model=learner.reference,
                    scheduler=learner.scheduler,
                    grammars=learner.grammars,
                )
            except (MemoryError, RuntimeError) as exc:
                stopped = out_of_memory(exc, step=step, token_budget=training.token_budget)
                if stopped is None:
                    raise
                raise stopped from None
            finally:
                learner.model.train(False)
                await learner.run(_return_freed_memory, learner.device)
            if metrics.unreplayed_tokens:
                run.log.warning(
                    "step %d: %d tokens generated under a grammar did not replay under it "
                    "(scored without its mask); the engine enforced another grammar",
                    step,
                    metrics.unreplayed_tokens,
                )
            pushing = time.monotonic()
            try:
                await update.push(learner.model)
            except VllmEngineError as exc:  # the engine still has the old weights
                raise TrainingStopped(f"the new weights did not reach vLLM: {exc}") from None
            sync_sec = time.monotonic() - pushing
    rewards = [x for x in (_reward(r.result) for r in done) if x is not None]
    threshold = training.pass_threshold
    passed = [passes(_status(r.result), _reward(r.result), threshold) for r in done]
    generation_sec = generated - started
    tokens = stats.policy_tokens + sampled.dropped_tokens
    return {
        "step": step,
        "reward_mean": statistics.fmean(rewards) if rewards else None,
        "reward_std": statistics.pstdev(rewards) if rewards else None,
        "pass_rate": sum(passed) / len(passed),
        "loss": metrics.loss if metrics else None,
        "kl": metrics.kl if metrics else None,
        "clip_fraction": metrics.clip_fraction if metrics else None,
        "mean_ratio": metrics.mean_ratio if metrics else None,
        "engine_mismatch_kl": metrics.engine_mismatch_kl if metrics else None,
        "tis_capped_fraction": metrics.tis_capped_fraction if metrics else None,
        "constrained_fraction": metrics.constrained_fraction if metrics else None,
        "grad_norm": metrics.grad_norm if metrics else None,
        "tokens_generated": tokens,
        "tokens_trained": metrics.policy_tokens if metrics else 0,
        "tokens_forwarded": metrics.tokens if metrics else 0,
        "tokens_per_sec": tokens / generation_sec if generation_sec > 0 else None,
        "generation_sec": round(generation_sec, 3),
        "policy_busy_sec": round(run.generator.engine.busy_sec - busy, 3),
        "sequences_sec": round(built - generated, 3),
        "update_sec": round(time.monotonic() - built, 3),
        "weight_sync_sec": round(sync_sec, 3),
        "drift": stats.drift,
        "new_contexts": stats.new_contexts,
        "merges": stats.merges,
        "sequences": stats.sequences,
        "excluded": dict(stats.excluded),
        "zero_gradient_groups": len(zero),
        "resampled_groups": sampled.resampled,
        "groups_without_sequences": stats.groups_without_sequences,
        **_peak_memory(learner.device),
    }


def _peak_memory(device: Any) -> dict[str, float]:
    """The trainer's peak resident memory so far (Linux reports ``ru_maxrss`` in KiB) and,
    on CUDA, the peak GPU memory torch allocated on the learner's device."""
    import resource

    peaks = {"peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2, 3)}
    if device.type == "cuda":
        import torch

        peaks["peak_gpu_memory_gb"] = round(torch.cuda.max_memory_allocated(device) / 1024**3, 3)
    return peaks


def _return_freed_memory(device: Any) -> None:
    """Hand the update's freed host buffers back to the system (glibc only; blocking).

    glibc keeps freed memory resident for reuse, and the update's and generation's freed
    buffers are interleaved so that neither reuses much of the other's: without this the
    trainer's peak RSS on the calculator rises from 6.9 to 10 GB over 12 steps. It costs the
    next step about 0.15 s per GB to fault the pages in again. An update on a GPU frees
    little host memory, so there is nothing to trim.
    """
    if device.type != "cpu":
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


async def run_training(options: TrainOptions, hooks: TrainHooks | None = None) -> TrainOutcome:
    """Run (or resume) a training run; returns its outcome.

    Raises:
        ConfigError: Bad config, backend, dataset, model or secrets.
        RunLockedError: Another process holds the run.
        TrainingStopped: A non-finite step, a rollout server that died or did not start;
            applied steps stay checkpointed and the same command resumes.
    """
    hooks = hooks or QuietHooks()
    parse_backend_spec(options.backend, label="--backend")
    config = await asyncio.to_thread(load_train_config, options.config_path, options.overrides)
    # Before anything loads or starts: a device that is not there is the config's error, a
    # missing dependency one line with its install command.
    device = await asyncio.to_thread(
        resolve_device, config.training.device, key="[training] device", feature=_FEATURE
    )
    await asyncio.to_thread(_check_dependencies, config)
    name = check_run_name(options.name or options.config_path.stem)
    output_root = config.workspace / ".osmosis" / "train"
    with contextlib.ExitStack() as held:
        lock = run_lock(output_root, name, command="osmosis train run", output_option=None)
        await asyncio.to_thread(held.enter_context, lock)
        run_dir = output_root / name
        if options.fresh:
            await asyncio.to_thread(shutil.rmtree, run_dir, True)
        await asyncio.to_thread(run_dir.mkdir, parents=True, exist_ok=True)
        secrets = secret_values(config.secrets)
        key = token_urlsafe(32)
        # The trackers' credentials (WANDB_API_KEY...) and any other in the environment.
        credentials = credential_env_values(os.environ)
        redactor = Redactor((key, *secrets.values(), *credentials))
        log = held.enter_context(run_log(run_dir / "logs.txt", redactor))
        stack = _StackInputs(key, secrets, redactor, options.backend, log)
        return await _train(config, run_dir, device, stack, hooks)


def _check_dependencies(config: TrainConfig) -> None:
    """Import what training will need, so a missing package stops the run before any server
    starts (llguidance: the grammars of tool calls, which the learner also replays).

    Raises:
        MissingExtraError: A package is missing; the message gives its install command.
    """
    import_torch_stack(_FEATURE)
    import_llguidance(_FEATURE)
    if config.training.lora_rank:
        import_peft(_FEATURE)
    check_trackers(config.training.report_to, "[training] report_to")


@dataclass(frozen=True)
class _StackInputs:
    key: str
    """The rollout key the gateway accepts (redacted everywhere)."""
    secrets: dict[str, str]
    redactor: Redactor
    backend: str
    log: logging.Logger


async def _train(
    config: TrainConfig, run_dir: Path, device: Any, inputs: _StackInputs, hooks: TrainHooks
) -> TrainOutcome:
    training, events_path = config.training, run_dir / "events.jsonl"
    items, train_rows, held_out = await asyncio.to_thread(_dataset_rows, config)
    events = await asyncio.to_thread(_read_lines, events_path)
    start = _last_checkpoint(events)
    # The viewer reads the run's length and model from this line; the settings are the ones
    # this session trains with (the file's, with its --set overrides).
    started = {
        "event": "start",
        "step": start,
        "steps": training.steps,
        "model": config.model,
        "training": dataclasses.asdict(training),
        "eval_dataset": str(config.eval_dataset) if config.eval_dataset else None,
        "overrides": list(config.overrides),
    }
    await asyncio.to_thread(_append, events_path, started)
    hooks.message(
        f"run {run_dir.name}: resuming after step {start}" if start else f"run {run_dir.name}"
    )
    tracked = TrackedRun(
        run_dir,
        run_dir.name,
        params={"dataset": str(config.dataset), **_without(started, "event", "step", "steps")},
        resumed_after=start,
        mlflow_default_uri=f"sqlite:///{config.workspace / '.osmosis' / 'mlflow.db'}",
    )

    def say(text: str) -> None:  # a tracker's error may quote its credential
        hooks.message(inputs.redactor.text(text))
        inputs.log.warning("%s", inputs.redactor.text(text))

    try:
        trackers = await asyncio.to_thread(open_trackers, training.report_to, tracked, say)
    except TrackerError as exc:
        raise TrackerError(inputs.redactor.text(str(exc))) from None
    try:
        base = await asyncio.to_thread(_resolve_quietly, config.model)
        source = _checkpoint_dir(run_dir, start) if start else base
        learner = await Learner.load(config, source, base, device)
        try:
            # Also before the first checkpoint: steps applied but not checkpointed run again.
            await asyncio.to_thread(_rewind, run_dir, start)
            if start:
                await learner.run(learner.restore, source)
                await asyncio.to_thread(_append, events_path, {"event": "resume", "step": start})
            outcome = TrainOutcome(run_dir, steps_done=start, evals=_evals(events, start))
            rows = _Rows(items, train_rows, held_out)
            await _serve(config, learner, base, inputs, hooks, outcome, rows, trackers)
            return outcome
        finally:
            await asyncio.to_thread(learner.close)
    finally:
        await asyncio.to_thread(trackers.close)


def _without(line: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in line.items() if key not in keys}


@dataclass(frozen=True)
class _Rows:
    items: list[DatasetItem]
    train: list[int]
    held_out: list[int]


async def _serve(
    config: TrainConfig,
    learner: Learner,
    base_dir: Path,
    inputs: _StackInputs,
    hooks: TrainHooks,
    outcome: TrainOutcome,
    rows: _Rows,
    trackers: Trackers,
) -> None:
    """Serve the learner's model through the gateway, start the rollout server, run the loop."""
    training, secrets, redactor, log = config.training, inputs.secrets, inputs.redactor, inputs.log
    run_dir, start = outcome.run_dir, outcome.steps_done
    server = RolloutServerProcess(
        rollout_dir=config.rollout_dir,
        entrypoint=config.entrypoint,
        env={
            **config.env,
            **secrets,
            SECRET_ENV_NAMES_ENV: ",".join(sorted(secrets)),
            BACKEND_ENV: inputs.backend,
        },
        artifact_root=run_dir / "rollouts",
        log=lambda line: log.info("%s", line, extra={"step": "rollout-server"}),
        redact=redactor.text,
    )
    front = ChatFront.of_model(
        learner.served_model,
        learner.tokenizer,
        default_max_tokens=training.max_tokens,
        tool_format=training.tool_format,
    )
    native = front.tool_format
    tool_calls = f"tool calls: {f'native ({native.name})' if native else 'instruction'} format"
    hooks.message(tool_calls)
    log.info("%s", tool_calls)
    try:
        # The seam: the gateway serves the chat front, the trainer pushes weights to the engine.
        async with (
            open_generator(
                config, learner, base_dir=base_dir, run_dir=run_dir, version=start,
                log=log, redact=redactor.text, say=hooks.message,
            ) as generator,
            rollout_stack(
                EnginePolicy(front, generator.engine, name=f"{run_dir.name}-policy"),
                server,
                token=inputs.key,
                secrets=secrets.values(),
                model_label=config.model,
                log=log,
                say=hooks.message,
                sampling={"temperature": training.temperature, "max_tokens": training.max_tokens},
            ) as stack,
        ):  # fmt: skip
            run = _Run(
                config, run_dir, rows.items, generator, stack, log, hooks, redactor, trackers
            )
            await _loop(run, learner, outcome, rows.train, rows.held_out)
    except RolloutStackError as exc:
        raise TrainingStopped(f"{redactor.text(str(exc))}; no step was applied") from None


def _resolve_quietly(model: str) -> Path:
    """`resolve_model` without transformers' warnings (the embedded model's one-off conversion
    also shows a plain tqdm bar, which only the CLI turns off: see ``silence_tqdm``)."""
    with quiet_transformers():
        return resolve_model(model)


def _evals(events: list[dict[str, Any]], start: int) -> list[EvalPoint]:
    """Held-out results already journaled up to the checkpoint a resume starts from."""
    evals = [e for e in events if e.get("event") == "eval"]
    return [EvalPoint.from_json(e) for e in evals if int(e["step"]) <= start]


async def _loop(
    run: _Run, learner: Learner, outcome: TrainOutcome, train_rows: list[int], held_out: list[int]
) -> None:
    from osmosis_ai.train.grpo import NonFiniteStepError

    training, run_dir = run.config.training, run.run_dir
    if not any(point.step == outcome.steps_done for point in outcome.evals):
        outcome.evals.append(await run.evaluate(outcome.steps_done, held_out))
    metrics_path = run_dir / "metrics.jsonl"
    spent = sum(map(step_seconds, await asyncio.to_thread(_read_lines, metrics_path)))
    if training.max_minutes and spent >= training.max_minutes * 60:
        run.hooks.message(
            f"nothing to do: the steps already took max_minutes ({spent / 60:.1f} min)"
        )
        return
    run.hooks.started(outcome.steps_done + 1, training.steps)
    flat_steps = FlatStepsHint(training.prompts_per_step, training.resample_zero_gradient)
    for step in range(outcome.steps_done + 1, training.steps + 1):
        try:
            metrics = await _step(run, learner, train_rows, step)
        except (NonFiniteStepError, TrainingStopped) as exc:
            last = _last_checkpoint(await asyncio.to_thread(_read_lines, run_dir / "events.jsonl"))
            # Redacted: an error from the rollout server or a workflow may quote a secret.
            reason = run.redactor.text(
                f"{exc}; step {step} was not applied, the last checkpoint is step {last}"
            )
            await asyncio.to_thread(
                _append,
                run_dir / "events.jsonl",
                {"event": "stopped", "step": step, "reason": reason},
            )
            raise TrainingStopped(reason, outcome) from None
        await asyncio.to_thread(_append, metrics_path, metrics)
        await asyncio.to_thread(_append, run_dir / "events.jsonl", {"event": "step", "step": step})
        await asyncio.to_thread(run.trackers.log, scalars(metrics), step)
        run.hooks.step_done(metrics)
        hint = flat_steps.after(metrics)
        if hint:
            run.hooks.message(hint)
            run.log.info("%s", hint)
        outcome.steps_done = step
        spent += step_seconds(metrics)
        out_of_time = bool(training.max_minutes) and spent >= training.max_minutes * 60
        last = step == training.steps or out_of_time
        if step % training.checkpoint_every == 0 or last:
            await learner.run(_checkpoint, learner, run_dir, step, training.keep_checkpoints)
        if (training.eval_every and step % training.eval_every == 0) or last:
            outcome.evals.append(await run.evaluate(step, held_out))
        if out_of_time:
            run.hooks.message(
                f"stopped after step {step}: the steps took {spent / 60:.1f} min "
                f"(max_minutes = {training.max_minutes:g})"
            )
            return


class FlatStepsHint:
    """Says once when most groups of several steps in a row had all-equal rewards (such
    groups give no gradient, so those steps train little), with the setting that helps."""

    IN_A_ROW = 3

    def __init__(self, groups: int, resample: int) -> None:
        self._groups, self._resample = groups, resample
        self._row = 0
        self._said = False

    def after(self, metrics: Mapping[str, Any]) -> str | None:
        """The hint to print after a step's line, or ``None``."""
        flat = 2 * int(metrics.get("zero_gradient_groups") or 0) > self._groups
        self._row = self._row + 1 if flat else 0
        if self._said or self._row < self.IN_A_ROW:
            return None
        self._said = True
        fix = (
            f"raise resample_zero_gradient (now {self._resample}) or group_size"
            if self._resample
            else "set resample_zero_gradient = 2 to run such groups again within the step"
        )
        return (
            f"most groups had all-equal rewards in {self._row} steps in a row (no gradient: "
            f"those steps train little); in [training], {fix}"
        )


def _checkpoint(learner: Learner, run_dir: Path, step: int, keep: int) -> None:
    """Save the checkpoint, journal it, then drop all but the newest ``keep`` (blocking)."""
    directory = _checkpoint_dir(run_dir, step)
    directory.parent.mkdir(parents=True, exist_ok=True)
    learner.save(directory, step)
    _append(run_dir / "events.jsonl", {"event": "checkpoint", "step": step})
    # ``checkpoints/latest`` names the newest one for `osmosis eval run --model torch:...`.
    latest = directory.parent / LATEST_CHECKPOINT
    temp = latest.with_name(f".{LATEST_CHECKPOINT}.tmp")
    temp.unlink(missing_ok=True)
    temp.symlink_to(directory.name, target_is_directory=True)
    os.replace(temp, latest)
    # Directories of later steps are leftovers of steps a resume ran again: never kept.
    kept = [p for n, p in checkpoint_steps(directory.parent).items() if n <= step][-keep:]
    for old in directory.parent.iterdir():
        if old not in (*kept, latest):
            shutil.rmtree(old, ignore_errors=True)
