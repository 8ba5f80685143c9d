"""``osmosis train run``: GRPO on the user's workflow and grader, served from live weights.

Each step picks rows (seeded by the step, so a resumed run picks the same ones), runs
``group_size`` rollouts per row through the rollout server (under ``max_staleness`` > 0,
while earlier steps update), turns the gateway's call records into sequences and applies one
update inside the token engine's ``updating()`` (no model call runs while the weights
change), then pushes the new weights to the engine. The gateway serves an `EnginePolicy`: a
`ChatFront` on that engine. The run directory
``.osmosis/train/<run>/`` holds:

- ``events.jsonl``: the journal (``start``, ``step`` with the rollouts it trained on,
  ``eval``, ``checkpoint``, ``resume``, ``stopped``); the last ``checkpoint`` line is the
  last step a resume starts after, and a resume drops the ``step`` and ``eval`` lines after
  it (those steps run again, and are journaled once);
- ``metrics.jsonl``: one line per applied step (rewound the same way);
- ``rollouts.jsonl``: one line per finished rollout (status, reward, tokens, error);
- ``checkpoints/step-NNNN/``: weights (``save_pretrained``; the adapter under LoRA),
  tokenizer and ``trainer.pt`` (optimizer, scheduler, RNG states, step), each renamed into
  place whole (the newest ``[checkpoints] keep`` are kept), and ``checkpoints/latest``, a link
  to the newest;
- ``rollouts/``: every rollout's files (ATIF trajectories), the server's artifact root.

The loop's parts: `rows` (which rows train, are held out, and each step samples),
`rollouts` (a row's rollout through the rollout stack, a held-out evaluation), the
`producer` of rollout groups with its `group_queue` and `admission` rule (the staleness
bound), the `consumer` that trains on them, and `step` (sequences → update → weights pushed
to the engine and probed, the step's metrics); ``learner/checkpoints`` saves,
``bookkeeping/journal`` writes and rewinds the run directory's lines, `outcome` is what the
caller hears and gets back. This module is the entry point: it sets the run up and hands it
to the consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from secrets import token_urlsafe
from typing import Any

from osmosis_ai.environments.served import server_env
from osmosis_ai.eval.prepare import build_judge, judge_keys, secret_values
from osmosis_ai.eval.run_dir import check_run_name, run_lock, run_log
from osmosis_ai.eval.server_process import RolloutServerProcess
from osmosis_ai.eval.stack import RolloutStackError, rollout_stack
from osmosis_ai.gateway import Judge
from osmosis_ai.gateway.policies.chat_front import ChatFront
from osmosis_ai.gateway.policies.engine_policy import EnginePolicy
from osmosis_ai.gateway.policies.hf_dir import (
    import_llguidance,
    import_peft,
    import_torch_stack,
    quiet_transformers,
)
from osmosis_ai.gateway.policies.torch_device import resolve_device, update_in_bf16
from osmosis_ai.redact import Redactor, credential_env_values
from osmosis_ai.rollout.server.app import BACKEND_ENV, SECRET_ENV_NAMES_ENV, parse_backend_spec
from osmosis_ai.train.bookkeeping.journal import (
    append,
    journaled_evals,
    last_checkpoint,
    read_lines,
    rewind,
)
from osmosis_ai.train.bookkeeping.trackers import (
    TrackedRun,
    TrackerError,
    Trackers,
    check_trackers,
    open_trackers,
)
from osmosis_ai.train.config import TrainConfig, load_train_config, resolved_toml
from osmosis_ai.train.generation.generator import open_generator
from osmosis_ai.train.learner.checkpoints import LATEST_CHECKPOINT, checkpoint_dir
from osmosis_ai.train.learner.core import Learner
from osmosis_ai.train.loop.consumer import train_steps
from osmosis_ai.train.loop.outcome import (
    EvalPoint,
    QuietHooks,
    TrainHooks,
    TrainingStopped,
    TrainOutcome,
)
from osmosis_ai.train.loop.report import step_seconds
from osmosis_ai.train.loop.rollouts import Run, held_out_pass_at_k
from osmosis_ai.train.loop.rows import Rows, dataset_rows, split_rows, step_rows
from osmosis_ai.train.loop.step import FlatStepsHint
from osmosis_ai.train.loop.verdict import finished_run, training_verdict
from osmosis_ai.train.model import resolve_model
from osmosis_ai.train.run_files import RUN_FILES

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
    "run_training",
    "split_rows",
    "step_rows",
    "step_seconds",
]

_FEATURE = "osmosis train"


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
    request_logs: bool = False
    """Keep the rollout server's per-request log lines in ``logs.txt`` (``--verbose``)."""


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
    name = check_run_name(options.name or options.config_path.stem)
    output_root = config.workspace / ".osmosis" / "train"
    if not options.fresh:  # a finished run says so from its files, loading nothing
        finished = await asyncio.to_thread(_finished, output_root / name, config)
        if finished is not None:
            hooks.message(f"run {name}: {finished[0]}")
            return finished[1]
    # Before anything loads or starts: a device that is not there is the config's error, a
    # missing dependency one line with its install command.
    device = await asyncio.to_thread(
        resolve_device, config.learner.device, key="[learner] device", feature=_FEATURE
    )
    await asyncio.to_thread(
        update_in_bf16, device, config.learner.precision, key="learner.precision"
    )
    await asyncio.to_thread(_check_dependencies, config)
    with contextlib.ExitStack() as held:
        lock = run_lock(output_root, name, command="osmosis train run", output_option=None)
        await asyncio.to_thread(held.enter_context, lock)
        run_dir = output_root / name
        if options.fresh:
            await asyncio.to_thread(shutil.rmtree, run_dir, True)
        await asyncio.to_thread(run_dir.mkdir, parents=True, exist_ok=True)
        secrets = secret_values(config.secrets)
        judge = build_judge(config.judge)
        withheld = judge_keys(judge, config.judge)
        key = token_urlsafe(32)
        # The trackers' credentials (WANDB_API_KEY...) and any other in the environment.
        credentials = credential_env_values(os.environ)
        redactor = Redactor((key, *secrets.values(), *withheld, *credentials))
        log = held.enter_context(run_log(run_dir / RUN_FILES.logs, redactor))
        stack = _StackInputs(
            key, secrets, redactor, options.backend, log, options.request_logs, judge, withheld
        )
        return await _train(config, run_dir, device, stack, hooks)


def _finished(run_dir: Path, config: TrainConfig) -> tuple[str, TrainOutcome] | None:
    """What to say, and the outcome, when the run at ``run_dir`` has nothing left to do."""
    metrics = read_lines(run_dir / RUN_FILES.metrics)
    events = read_lines(run_dir / RUN_FILES.events)
    finished = finished_run(events, metrics, config)
    if finished is None:
        return None
    message, evals = finished
    verdict = training_verdict(metrics, config)
    return message, TrainOutcome(run_dir, evals[-1].step, evals, verdict)


def _check_dependencies(config: TrainConfig) -> None:
    """Import what training will need, so a missing package stops the run before any server
    starts (llguidance: the grammars of tool calls, which the learner also replays).

    Raises:
        MissingExtraError: A package is missing; the message gives its install command.
    """
    import_torch_stack(_FEATURE)
    import_llguidance(_FEATURE)
    if config.learner.lora is not None:
        import_peft(_FEATURE)
    check_trackers(config.tracking.report_to, "[tracking] report_to")


@dataclass(frozen=True)
class _StackInputs:
    key: str
    """The rollout key the gateway accepts (redacted everywhere)."""
    secrets: dict[str, str]
    redactor: Redactor
    backend: str
    log: logging.Logger
    request_logs: bool
    judge: Judge | None
    """The ``[judge]``'s model, served on every rollout's judge route."""
    withheld: tuple[str, ...]
    """The judge's keys: never given to the rollout server."""


async def _train(
    config: TrainConfig, run_dir: Path, device: Any, inputs: _StackInputs, hooks: TrainHooks
) -> TrainOutcome:
    training, events_path = config.training, run_dir / RUN_FILES.events
    items, train_rows, held_out = await asyncio.to_thread(dataset_rows, config)
    events = await asyncio.to_thread(read_lines, events_path)
    start = last_checkpoint(events)
    # The viewer reads the run's length and model from this line; the settings are the ones
    # this session trains with (the recipe's, the file's, its --set overrides), which
    # config.toml also holds as TOML.
    await asyncio.to_thread(
        (run_dir / RUN_FILES.config).write_text, inputs.redactor.text(resolved_toml(config))
    )
    started = {
        "event": "start",
        "step": start,
        "steps": training.steps,
        "model": config.experiment.model,
        "settings": config.settings(),
        "eval_dataset": str(config.eval_dataset) if config.eval_dataset else None,
        "overrides": list(config.overrides),
    }
    await asyncio.to_thread(append, events_path, started)
    hooks.message(
        f"run {run_dir.name}: resuming after step {start}" if start else f"run {run_dir.name}"
    )
    for note in config.notes:
        hooks.message(note)
        inputs.log.info("%s", note)
    tracked = TrackedRun(
        run_dir,
        run_dir.name,
        params={
            "dataset": str(config.experiment.dataset),
            **_without(started, "event", "step", "steps", "settings"),
            **config.settings(),
        },
        resumed_after=start,
        mlflow_default_uri=f"sqlite:///{config.workspace / '.osmosis' / 'mlflow.db'}",
    )

    def say(text: str) -> None:  # a tracker's error may quote its credential
        hooks.message(inputs.redactor.text(text))
        inputs.log.warning("%s", inputs.redactor.text(text))

    try:
        trackers = await asyncio.to_thread(open_trackers, config.tracking.report_to, tracked, say)
    except TrackerError as exc:
        raise TrackerError(inputs.redactor.text(str(exc))) from None
    try:
        base = await asyncio.to_thread(_resolve_quietly, config.experiment.model)
        source = checkpoint_dir(run_dir, start) if start else base
        learner = await Learner.load(config, source, base, device)
        try:
            # Also before the first checkpoint: steps applied but not checkpointed run again.
            await asyncio.to_thread(rewind, run_dir, start)
            if start:
                await learner.run(learner.restore, source)
                await asyncio.to_thread(append, events_path, {"event": "resume", "step": start})
            outcome = TrainOutcome(run_dir, steps_done=start, evals=journaled_evals(events, start))
            rows = Rows(items, train_rows, held_out)
            await _serve(config, learner, base, inputs, hooks, outcome, rows, trackers)
            metrics = await asyncio.to_thread(read_lines, run_dir / RUN_FILES.metrics)
            outcome.verdict = training_verdict(metrics, config)
            if outcome.verdict:
                inputs.log.warning("%s", outcome.verdict)
            return outcome
        finally:
            await asyncio.to_thread(learner.close)
    finally:
        await asyncio.to_thread(trackers.close)


def _without(line: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in line.items() if key not in keys}


async def _serve(
    config: TrainConfig,
    learner: Learner,
    base_dir: Path,
    inputs: _StackInputs,
    hooks: TrainHooks,
    outcome: TrainOutcome,
    rows: Rows,
    trackers: Trackers,
) -> None:
    """Serve the learner's model through the gateway, start the rollout server, run the loop."""
    sampling, secrets, redactor, log = config.sampling, inputs.secrets, inputs.redactor, inputs.log
    environment = config.environment
    run_dir, start = outcome.run_dir, outcome.steps_done
    server = RolloutServerProcess(
        rollout_dir=config.rollout_dir,
        entrypoint=config.entrypoint_path.name,
        python=environment.python if environment else None,
        env={
            **config.env,
            # The trainer's [sampling] max_tokens caps each call, not the section's.
            **(
                server_env(environment, config.workspace, config.env, max_tokens=None)
                if environment
                else {}
            ),
            **secrets,
            SECRET_ENV_NAMES_ENV: ",".join(sorted(secrets)),
            BACKEND_ENV: inputs.backend,
        },
        artifact_root=run_dir / RUN_FILES.rollouts,
        log=lambda line: log.info("%s", line, extra={"step": "rollout-server"}),
        redact=redactor.text,
        withheld=inputs.withheld,
        request_logs=inputs.request_logs,
    )
    front = ChatFront.of_model(
        learner.served_model,
        learner.tokenizer,
        default_max_tokens=sampling.max_tokens,
        tool_format=sampling.tool_format,
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
                model_label=config.experiment.model,
                log=log,
                say=hooks.message,
                sampling={"temperature": sampling.temperature, "max_tokens": sampling.max_tokens},
                judge=inputs.judge,
            ) as stack,
        ):  # fmt: skip
            run = Run(config, run_dir, rows.items, generator, stack, log, hooks, redactor, trackers)
            await train_steps(run, learner, outcome, rows.train, rows.held_out)
    except RolloutStackError as exc:
        raise TrainingStopped(f"{redactor.text(str(exc))}; no step was applied") from None


def _resolve_quietly(model: str) -> Path:
    """`resolve_model` without transformers' warnings (the embedded model's one-off conversion
    also shows a plain tqdm bar, which only the CLI turns off: see ``silence_tqdm``)."""
    with quiet_transformers():
        return resolve_model(model)
