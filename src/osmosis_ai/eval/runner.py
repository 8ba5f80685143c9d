"""``run_eval``: the controller role for a dataset, over the real protocol, resumable.

It starts the model gateway in this process and the user's rollout server as a child
process, drives one rollout per (row, run) with ``RolloutClient``, journals every received
result durably before counting it, and rebuilds the run's projections from the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from secrets import token_urlsafe
from typing import Any

from osmosis_ai._log_redaction import registered_secrets
from osmosis_ai.errors import ConfigError, RolloutProtocolError
from osmosis_ai.eval.config import EvalConfig, load_eval_config
from osmosis_ai.eval.datasets import Dataset, DatasetItem, load_dataset
from osmosis_ai.eval.journal import STORAGE_ERROR, Journal, JournalRecord, pending_items
from osmosis_ai.eval.projections import write_projections
from osmosis_ai.eval.run_dir import (
    PREVIEWS_DIR,
    canonical_digest,
    open_run_dir,
    run_lock,
    run_log,
    source_digest,
)
from osmosis_ai.eval.server_process import RolloutServerError, RolloutServerProcess
from osmosis_ai.gateway import Gateway, Policy, build_policy, displayable_policy_spec, preflight
from osmosis_ai.rollout._scrub import scrub_files
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.server.app import (
    BACKEND_ENV,
    SECRET_ENV_NAMES_ENV,
    parse_backend_spec,
)
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.rollout.trajectory.preview import PREVIEW_ROOT_ENV
from osmosis_ai.rollout.trajectory.redact import Redactor
from osmosis_ai.rollout.trajectory.save import describe_storage_error

__all__ = ["EvalOptions", "EvalOutcome", "run_eval"]

_ROLLOUT_PROTOCOL = "0.4"
_ITEM_SLACK_SEC = 60.0
_DEFAULT_CONCURRENCY = 4
_MAX_ERROR_MESSAGE_CHARS = 2000

Item = tuple[int, int]  # (row_index, run_index)


@dataclass(frozen=True)
class EvalOptions:
    """What ``osmosis eval run`` was asked to do."""

    config_path: Path
    name: str | None = None
    output: Path | None = None
    dataset_file: Path | None = None
    rows: str | None = None
    n: int | None = None
    max_in_flight: int | None = None
    fresh: bool = False
    retry_failed: bool = False
    policy_api_key: str | None = None
    upstream_timeout_sec: float | None = None
    """Bound of one call to the policy's upstream (``--upstream-timeout``); None: 600 s."""
    backend: str = "local"
    """Where the rollout server runs rollouts: ``local``, ``ray``, ``ray:ADDRESS``,
    ``process`` or ``process:sandbox``."""


@dataclass
class EvalOutcome:
    """How a run ended."""

    run_name: str
    run_dir: Path
    total: int
    resumed: int
    dispatched: int = 0
    complete: bool = False
    halted: str | None = None
    """Why dispatching stopped early (remaining items stay pending), if it did."""
    metrics: dict[str, Any] = field(default_factory=dict)
    failed_rows: list[dict[str, Any]] = field(default_factory=list)


#: Called once per finished item: (record, done_count, total_count).
ItemCallback = Callable[[JournalRecord, int, int], None]


def _inputs(config: EvalConfig, dataset: Dataset, n: int) -> dict[str, Any]:
    return {
        "model_path": displayable_policy_spec(config.experiment.model_path),
        "dataset": {
            "sha256": dataset.sha256,
            "selected_source_rows": dataset.selected_source_rows,
        },
        "n": n,
        "rollout": {
            "name": config.experiment.rollout,
            "entrypoint": config.experiment.entrypoint,
            "source_digest": source_digest(config.rollout_dir),
        },
        "env": dict(sorted(config.env.items())),
        "secret_names": sorted(config.secrets),
        "timeouts": {
            "agent_timeout_sec": config.evaluation.agent_timeout_sec,
            "grader_timeout_sec": config.evaluation.grader_timeout_sec,
        },
        "versions": {
            "rollout_protocol": _ROLLOUT_PROTOCOL,
            "dataset_normalization": 1,
            "state_schema": 1,
        },
    }


def _secret_values(config: EvalConfig) -> dict[str, str]:
    missing = [name for name in config.secrets if not os.environ.get(name)]
    if missing:
        raise ConfigError(
            f"[secrets] requires {', '.join(missing)}; set them in the environment first"
        )
    return {name: os.environ[name] for name in config.secrets}


@dataclass(frozen=True, repr=False)
class _Keys:
    """Every key this invocation knows: what it scrubs from its outputs."""

    rollout: str
    """The rollout key (the gateway's token), the only key the rollout server gets."""
    policy: tuple[str, ...]
    """The policy's credentials: withheld from the rollout server."""
    redactor: Redactor
    """Redacts both, and the ``[secrets]`` values."""


def _policy_credentials(policy: Policy, api_key: str | None) -> tuple[str, ...]:
    # The key from the environment counts even when the caller passed none.
    candidates = (*policy.secrets(), api_key, os.environ.get("OSMOSIS_POLICY_API_KEY"))
    return tuple(dict.fromkeys(key for key in candidates if key))


def _refuse_policy_keys(
    config: EvalConfig, secrets: Mapping[str, str], policy_keys: tuple[str, ...]
) -> None:
    """The rollout server must never get the policy's credentials, even when asked to."""
    for where, entries in (("secrets.required: ", secrets), ("env.", config.env)):
        for name, value in entries.items():
            if any(key in value for key in policy_keys):
                raise ConfigError(
                    f"{where}{name} holds the policy's key, which the rollout server never gets "
                    "(its workflow reaches the model through the gateway with its rollout key); "
                    f"remove {name} from the eval config or give the policy another key"
                )


@dataclass
class _Prepared:
    config: EvalConfig
    dataset: Dataset
    n: int
    inputs: dict[str, Any]
    run_name: str
    output_root: Path
    secrets: dict[str, str]
    policy: Policy
    keys: _Keys


def _prepare(options: EvalOptions) -> _Prepared:
    """Everything that reads files before a run (in a worker thread)."""
    parse_backend_spec(options.backend, label="--backend")
    config = load_eval_config(options.config_path)
    secrets = _secret_values(config)
    policy = build_policy(
        config.experiment.model_path,
        api_key=options.policy_api_key,
        timeout_sec=options.upstream_timeout_sec,
    )
    policy_keys = _policy_credentials(policy, options.policy_api_key)
    _refuse_policy_keys(config, secrets, policy_keys)
    rollout_key = token_urlsafe(32)
    keys = _Keys(rollout_key, policy_keys, Redactor((rollout_key, *policy_keys, *secrets.values())))
    dataset = load_dataset(
        options.dataset_file or config.experiment.dataset,
        rows=options.rows,
        limit=config.evaluation.limit,
    )
    n = options.n or config.evaluation.n
    inputs = _inputs(config, dataset, n)
    return _Prepared(
        config=config,
        dataset=dataset,
        n=n,
        inputs=inputs,
        run_name=options.name or f"{options.config_path.stem}-{canonical_digest(inputs)[:8]}",
        output_root=(options.output or config.workspace / ".osmosis" / "evals").resolve(),
        secrets=secrets,
        policy=policy,
        keys=keys,
    )


def _scrub(path: Path, keys: _Keys) -> list[Path]:
    """Scrub every known key from the files below ``path`` (see `scrub_files`)."""
    return scrub_files(path, keys.redactor.secrets)


async def run_eval(
    options: EvalOptions,
    *,
    on_item: ItemCallback | None = None,
    on_message: Callable[[str], None] | None = None,
    on_plan: Callable[[dict[str, str]], None] | None = None,
    on_run_dir: Callable[[Path], Awaitable[None]] | None = None,
) -> EvalOutcome:
    """Run (or resume) an evaluation; returns how it ended.

    ``on_run_dir`` is awaited once the run directory exists, before anything is dispatched
    (``osmosis eval run --view`` starts the viewer there).

    Items already journaled are not run again. A dead rollout server, an unreachable model
    or a fatal model preflight stops dispatching and leaves the remaining items pending;
    Ctrl-C (cancellation) does the same, then re-raises.

    The policy's credentials never reach the rollout server. Every key the run knows (the
    policy's, the rollout key, ``[secrets]`` values) is redacted from what it reports and
    scrubbed from the files under the run directory: an item's as it finishes, all of them
    when the run stops.

    Raises:
        ConfigError: Bad config, dataset, rows, secrets, or a run with other inputs.
        RunLockedError: Another runner holds the run.
    """
    prepared = await asyncio.to_thread(_prepare, options)
    config, dataset, n = prepared.config, prepared.dataset, prepared.n
    secrets, keys = prepared.secrets, prepared.keys

    def say(text: str) -> None:
        if on_message is not None:
            on_message(keys.redactor.text(text))

    run_name = prepared.run_name
    run_dir = prepared.output_root / run_name
    with contextlib.ExitStack() as held:
        await asyncio.to_thread(held.enter_context, run_lock(prepared.output_root, run_name))
        manifest = await asyncio.to_thread(
            open_run_dir, run_dir, prepared.inputs, fresh=options.fresh
        )
        journal = Journal(run_dir / "events.jsonl")
        records = await asyncio.to_thread(_open_journal, journal)
        items = [(item.row_index, run) for item in dataset.items for run in range(n)]
        pending = pending_items(items, records, retry_failed=options.retry_failed)
        resumed = {key for key in records if key not in pending}
        outcome = EvalOutcome(run_name, run_dir, total=len(items), resumed=len(resumed))
        if on_run_dir is not None:
            await on_run_dir(run_dir)
        if on_plan is not None:
            on_plan(
                {
                    "Rollout": f"{config.experiment.rollout} ({config.experiment.entrypoint})",
                    "Model": displayable_policy_spec(config.experiment.model_path),
                    "Dataset": f"{dataset.path.name} ({dataset.path})",
                    "Rows": f"{len(dataset.items)} of {dataset.total_rows}",
                    "Runs per row": str(n),
                    "Work items": f"{len(items)} ({len(pending)} to run, {len(resumed)} done)",
                    "Output": str(run_dir),
                }
            )  # nothing here holds a key: the model is shown without URL credentials
        say(f"run {run_name}: {len(pending)} of {len(items)} work items to run")
        try:
            if pending:
                # Every osmosis_ai log record of this process is scrubbed of the run's keys too.
                with registered_secrets(keys.redactor.secrets):
                    await _dispatch(
                        config,
                        dataset,
                        pending,
                        journal,
                        secrets,
                        options,
                        outcome,
                        on_item,
                        say,
                        policy=prepared.policy,
                        keys=keys,
                    )
        finally:

            def project() -> Any:
                return write_projections(
                    run_dir,
                    manifest=manifest,
                    records=journal.replay(),
                    items=items,
                    dataset=dataset,
                    resumed_keys=resumed,
                    pass_threshold=config.evaluation.pass_threshold,
                    model_name=displayable_policy_spec(config.experiment.model_path),
                    rollout_name=config.experiment.rollout,
                )

            try:
                finished = await asyncio.to_thread(project)
            except OSError as exc:
                # The journal stays the authority: the next run rebuilds these files.
                outcome.halted = outcome.halted or _storage_halt(
                    run_dir, describe_storage_error(exc)
                )
            else:
                outcome.metrics = finished.metrics
                outcome.failed_rows = finished.failed_rows
                outcome.complete = finished.complete
            await _scrub_run_dir(outcome, keys)
    return outcome


def _storage_halt(run_dir: Path, reason: str) -> str:
    return f"cannot store results under {run_dir}: {reason}; free space there (or make it writable)"


async def _scrub_run_dir(outcome: EvalOutcome, keys: _Keys) -> None:
    """Scrub the whole run directory, copies included; what resists stops the run."""
    stuck = await asyncio.to_thread(_scrub, outcome.run_dir, keys)
    if stuck:
        outcome.complete = False
        outcome.halted = (
            f"{len(stuck)} file(s) could be neither scrubbed of the run's keys nor deleted, "
            f"e.g. {stuck[0]}; delete them by hand"
        )


def _open_journal(journal: Journal) -> dict[Item, JournalRecord]:
    journal.open()
    return journal.replay()


async def _dispatch(
    config: EvalConfig,
    dataset: Dataset,
    pending: list[Item],
    journal: Journal,
    secrets: dict[str, str],
    options: EvalOptions,
    outcome: EvalOutcome,
    on_item: ItemCallback | None,
    say: Callable[[str], None],
    *,
    policy: Policy,
    keys: _Keys,
) -> None:
    by_row = {item.row_index: item for item in dataset.items}
    redactor = keys.redactor
    async with Gateway(policy, token=keys.rollout, secrets=secrets.values()) as gateway:
        with run_log(outcome.run_dir / "logs.txt", redactor) as log:
            say(f"checking model {displayable_policy_spec(config.experiment.model_path)}")
            check = await preflight(policy)
            log.info("model preflight: %s", check.message, extra={"step": "preflight"})
            if check.fatal:
                outcome.halted = f"model preflight failed: {check.message}"
                return
            server = RolloutServerProcess(
                rollout_dir=config.rollout_dir,
                entrypoint=config.experiment.entrypoint,
                env={
                    **config.env,
                    **secrets,
                    SECRET_ENV_NAMES_ENV: ",".join(sorted(secrets)),
                    # Live previews of in-flight rollouts, for `osmosis view`.
                    PREVIEW_ROOT_ENV: str((outcome.run_dir / PREVIEWS_DIR).resolve()),
                    BACKEND_ENV: options.backend,
                },
                artifact_root=outcome.run_dir / "rollout_trials",
                log=lambda line: log.info("%s", line, extra={"step": "rollout-server"}),
                redact=redactor.text,
                withheld=keys.policy,
            )
            say(f"starting rollout server ({config.experiment.entrypoint})")
            try:
                try:
                    url = await server.start()
                except RolloutServerError as exc:
                    outcome.halted = str(exc)
                    return
                async with RolloutClient(url=url) as client:
                    capacity = (await client.health()).get("concurrency", {}).get("max_concurrent")
                    concurrency = (
                        options.max_in_flight
                        or config.evaluation.batch_size
                        or capacity
                        or _DEFAULT_CONCURRENCY
                    )
                    if capacity:
                        concurrency = min(concurrency, capacity)
                    say(f"running {len(pending)} work items, up to {concurrency} in flight")
                    await _work(
                        client,
                        gateway,
                        server,
                        config,
                        by_row,
                        pending,
                        journal,
                        outcome,
                        concurrency,
                        outcome.resumed,  # items redone (failed, unstored) are not done yet
                        on_item,
                        log,
                        keys,
                    )
            finally:
                await server.stop()
                if outcome.halted:
                    outcome.halted = redactor.text(outcome.halted)


async def _work(
    client: RolloutClient,
    gateway: Gateway,
    server: RolloutServerProcess,
    config: EvalConfig,
    by_row: dict[int, DatasetItem],
    pending: list[Item],
    journal: Journal,
    outcome: EvalOutcome,
    concurrency: int,
    already_done: int,
    on_item: ItemCallback | None,
    log: logging.Logger,
    keys: _Keys,
) -> None:
    queue: asyncio.Queue[Item] = asyncio.Queue()
    for item in pending:
        queue.put_nowait(item)
    done = already_done
    agent = config.evaluation.agent_timeout_sec
    grader = config.evaluation.grader_timeout_sec
    item_deadline = max(agent or 0, 0) + max(grader or 0, 0) + _ITEM_SLACK_SEC

    async def run_item(row_index: int, run_index: int) -> JournalRecord | None:
        item = by_row[row_index]
        rollout_id = uuid.uuid4().hex
        started = time.monotonic()
        if item.error is not None:
            # Found unsendable when the dataset was read (named by file and row): the row
            # fails alone, nothing is sent, and the other rows run.
            return _record(
                item,
                run_index,
                rollout_id,
                started,
                "failed",
                error_type="validation_error",
                error_message=item.error,
            )
        try:
            handle = await client.run_rollout(
                item.prompt,
                gateway.chat_completions_url(rollout_id),
                rollout_id,
                llm_api_key=gateway.token,
                label=item.label,
                metadata=item.metadata,
                agent_timeout_sec=agent,
                grader_timeout_sec=grader,
                extra_fields={
                    "row_index": row_index,
                    "run_index": run_index,
                    "trajectory_report_url": gateway.trajectory_report_url(rollout_id),
                },
            )
        except RolloutProtocolError as exc:
            if exc.status_code is not None and 400 <= exc.status_code < 500:
                # The server's answer says what it refused (too large, too deep...) and why.
                return _record(
                    item,
                    run_index,
                    rollout_id,
                    started,
                    "failed",
                    error_type="rollout_protocol_error",
                    error_message=str(exc),
                )
            raise
        try:
            async with asyncio.timeout(item_deadline):
                result = await handle
        except TimeoutError:
            with contextlib.suppress(RolloutProtocolError):
                await handle.cancel()
            return _record(item, run_index, rollout_id, started, "failed", error_type="timeout")
        calls = gateway.records.calls(rollout_id)
        gateway.records.release(rollout_id)
        tokens = sum(int((call.usage or {}).get("total_tokens") or 0) for call in calls)
        if result.status is not RolloutStatus.SUCCESS:
            error = (result.err_category.value if result.err_category else None) or "rollout_failed"
            return _record(
                item,
                run_index,
                rollout_id,
                started,
                "failed",
                tokens=tokens,
                error_type=error,
                error_message=result.err_message or None,
            )
        if result.err_message is not None:
            # A successful result carries a message only when the server could not store
            # the rollout's files: the item is not done until they exist.
            return _record(
                item,
                run_index,
                rollout_id,
                started,
                "failed",
                tokens=tokens,
                error_type=STORAGE_ERROR,
                error_message=result.err_message,
            )
        sample = result.sample
        if sample is not None and sample.remove_sample:
            return _record(item, run_index, rollout_id, started, "skipped", tokens=tokens)
        reward = sample.reward if sample is not None else None
        return _record(
            item, run_index, rollout_id, started, "success", tokens=tokens, reward=reward
        )

    async def worker() -> None:
        nonlocal done
        while not queue.empty() and outcome.halted is None:
            row_index, run_index = queue.get_nowait()
            record = await run_item(row_index, run_index)
            if record is None:
                continue
            if record.error_message is not None:
                message = keys.redactor.text(record.error_message)[:_MAX_ERROR_MESSAGE_CHARS]
                record = dataclasses.replace(record, error_message=message)
            # At once, so an interrupted run leaves no key in a finished item's files either.
            await asyncio.to_thread(
                _scrub, outcome.run_dir / "rollout_trials" / record.rollout_id, keys
            )
            try:
                await journal.append_async(record)  # durable before it counts
            except OSError as exc:
                outcome.halted = _storage_halt(outcome.run_dir, describe_storage_error(exc))
                return
            if record.error_type == STORAGE_ERROR:
                assert record.error_message is not None
                outcome.halted = _storage_halt(outcome.run_dir, record.error_message)
                return
            outcome.dispatched += 1
            done += 1
            log.info(
                "row %d run %d: %s", row_index, run_index, record.status, extra={"step": "rollout"}
            )
            if on_item is not None:
                on_item(record, done, outcome.total)

    workers = {asyncio.create_task(worker()) for _ in range(min(concurrency, len(pending)))}
    server_exit = asyncio.create_task(server.wait())
    try:
        remaining = set(workers)
        while remaining and outcome.halted is None:
            finished, _ = await asyncio.wait(
                {*remaining, server_exit}, return_when=asyncio.FIRST_COMPLETED
            )
            if server_exit in finished:
                outcome.halted = f"the rollout server exited with status {server_exit.result()}"
            for task in finished - {server_exit}:
                remaining.discard(task)
                if task.exception() is not None and outcome.halted is None:
                    outcome.halted = f"dispatch stopped: {task.exception()}"
        if outcome.halted:
            log.error("%s", outcome.halted, extra={"step": "dispatch"})
    finally:
        for task in [*workers, server_exit]:
            task.cancel()
        await asyncio.gather(*workers, server_exit, return_exceptions=True)


def _record(
    item: DatasetItem,
    run_index: int,
    rollout_id: str,
    started: float,
    status: str,
    *,
    tokens: int | None = None,
    reward: float | None = None,
    error_type: str | None = None,
    error_message: str | None = None,
) -> JournalRecord:
    return JournalRecord(
        row_index=item.row_index,
        run_index=run_index,
        rollout_id=rollout_id,
        status=status,  # type: ignore[arg-type]
        source_row_index=item.source_row_index,
        reward=reward,
        tokens=tokens,
        duration_ms=round((time.monotonic() - started) * 1000, 1),
        error_type=error_type,
        error_message=error_message,
    )
