"""``run_eval``: the controller role for a dataset, over the real protocol, resumable.

It starts the model gateway in this process and the user's rollout server as a child
process (`rollout_stack`), drives one rollout per (row, run) with an `EvalRun`, journals
every received result durably before counting it, and rebuilds the run's projections
from the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from osmosis_ai._log_redaction import registered_secrets
from osmosis_ai.environments.served import server_env
from osmosis_ai.errors import RolloutProtocolError
from osmosis_ai.eval.datasets import DatasetItem
from osmosis_ai.eval.group_judge import group_judging, judge_group
from osmosis_ai.eval.hooks import EvalHooks, ItemProgress, QuietHooks
from osmosis_ai.eval.journal import STORAGE_ERROR, Journal, JournalRecord, pending_items
from osmosis_ai.eval.metrics import passes
from osmosis_ai.eval.prepare import EvalOptions, PreparedRun, prepare_run
from osmosis_ai.eval.projections import write_projections
from osmosis_ai.eval.run_dir import PREVIEWS_DIR, open_run_dir, run_lock, run_log
from osmosis_ai.eval.server_process import RolloutServerProcess
from osmosis_ai.eval.stack import RolloutStack, RolloutStackError, rollout_stack
from osmosis_ai.rollout.client import RolloutHandle
from osmosis_ai.rollout.server.app import BACKEND_ENV, SECRET_ENV_NAMES_ENV
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.rollout.storage import DURABLE_FILES_ENV
from osmosis_ai.rollout.trajectory.preview import PREVIEW_ROOT_ENV
from osmosis_ai.rollout.trajectory.save import describe_storage_error
from osmosis_ai.rollout.types import RolloutResultResponse

__all__ = ["EvalOptions", "EvalOutcome", "EvalRun", "run_eval"]

_ITEM_SLACK_SEC = 60.0
_DEFAULT_CONCURRENCY = 4
_MAX_ERROR_MESSAGE_CHARS = 2000

Item = tuple[int, int]  # (row_index, run_index)


#: How a workflow reaches the model whose rollouts are evaluated or trained.
CALL_THE_GATEWAY = (
    "the workflow must call get_rollout_context().chat_completions_url with its api_key (or "
    "use an agent integration); see docs/concepts.md#rolloutcontext-and-sample-sources"
)


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
    without_calls: int = 0
    """Rollouts of this invocation that ran to the end without a model call through the
    gateway: an agent that talks to another endpoint (or none) is not evaluating the model."""

    @property
    def warnings(self) -> list[str]:
        """What the run did that is probably not what was meant (printed after the results)."""
        if not self.without_calls:
            return []
        return [
            f"{self.without_calls} of {self.dispatched} rollouts made no model call through "
            f"the gateway, so their rewards say nothing about the model: {CALL_THE_GATEWAY}"
        ]


def _storage_halt(run_dir: Path, reason: str) -> str:
    return f"cannot store results under {run_dir}: {reason}; free space there (or make it writable)"


@dataclass(frozen=True)
class _Attempt:
    """One rollout of one work item, from the moment it is started."""

    item: DatasetItem
    run_index: int
    rollout_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.monotonic)

    def record(
        self,
        status: str,
        *,
        tokens: int | None = None,
        reward: float | None = None,
        error_type: str | None = None,
        error_message: str | None = None,
    ) -> JournalRecord:
        return JournalRecord(
            row_index=self.item.row_index,
            run_index=self.run_index,
            rollout_id=self.rollout_id,
            status=status,  # type: ignore[arg-type]
            source_row_index=self.item.source_row_index,
            reward=reward,
            tokens=tokens,
            duration_ms=round((time.monotonic() - self.started) * 1000, 1),
            error_type=error_type,
            error_message=error_message,
        )


@dataclass
class EvalRun:
    """The dispatch of a run's pending items over a started `RolloutStack`.

    Workers take items from one queue; `supervise` stops them all when one fails, the
    server dies or storage fails (``outcome.halted``), leaving what is left pending.
    """

    prepared: PreparedRun
    stack: RolloutStack
    journal: Journal
    outcome: EvalOutcome
    log: logging.Logger
    hooks: EvalHooks
    done: int
    """Items finished, resumed ones included (items redone are not done yet)."""
    passed: int = 0
    failed: int = 0
    by_row: dict[int, DatasetItem] = field(init=False)

    def __post_init__(self) -> None:
        self.by_row = {item.row_index: item for item in self.prepared.dataset.items}

    @property
    def _item_deadline(self) -> float:
        evaluation = self.prepared.config.evaluation
        agent, grader = evaluation.agent_timeout_sec, evaluation.grader_timeout_sec
        return max(agent or 0, 0) + max(grader or 0, 0) + _ITEM_SLACK_SEC

    @property
    def _group_judged(self) -> bool:
        return group_judging(self.stack.gateway.judge, self.prepared.config.judge)

    def _work(self, pending: list[Item]) -> list[tuple[int, tuple[int, ...]]]:
        """``pending`` as units of work: one item each, or, under the group judge, a row's
        pending runs together (a resumed row's group is the runs that run again)."""
        if not self._group_judged:
            return [(row, (run,)) for row, run in pending]
        rows: dict[int, list[int]] = {}
        for row, run in pending:
            rows.setdefault(row, []).append(run)
        return [(row, tuple(runs)) for row, runs in rows.items()]

    async def supervise(self, pending: list[Item], concurrency: int) -> None:
        """Run ``pending`` with up to ``concurrency`` rollouts in flight, until done or
        halted."""
        work = self._work(pending)
        queue: asyncio.Queue[tuple[int, tuple[int, ...]]] = asyncio.Queue()
        for unit in work:
            queue.put_nowait(unit)
        outcome = self.outcome
        widest = max((len(runs) for _, runs in work), default=1)
        count = min(max(1, concurrency // widest), len(work))
        workers = {asyncio.create_task(self.worker(queue)) for _ in range(count)}
        server_exit = asyncio.create_task(self.stack.server.wait())
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
                self.log.error("%s", outcome.halted, extra={"step": "dispatch"})
        finally:
            for task in [*workers, server_exit]:
                task.cancel()
            await asyncio.gather(*workers, server_exit, return_exceptions=True)

    async def worker(self, queue: asyncio.Queue[tuple[int, tuple[int, ...]]]) -> None:
        """Run units from ``queue`` one at a time; store and count each item."""
        while not queue.empty() and self.outcome.halted is None:
            row_index, runs = queue.get_nowait()
            for record in await self.run_items(row_index, runs):
                if not await self._store(record):
                    return
                self._count(record)

    async def _store(self, record: JournalRecord) -> bool:
        """Scrub and journal ``record``; False (and the run halted) when storage failed."""
        keys, run_dir = self.prepared.keys, self.outcome.run_dir
        if record.error_message is not None:
            message = keys.redactor.text(record.error_message)[:_MAX_ERROR_MESSAGE_CHARS]
            record = dataclasses.replace(record, error_message=message)
        # At once, so an interrupted run leaves no key in a finished item's files either.
        await asyncio.to_thread(keys.scrub, run_dir / "rollout_trials" / record.rollout_id)
        try:
            await self.journal.append_async(record)  # durable before it counts
        except OSError as exc:
            self.outcome.halted = _storage_halt(run_dir, describe_storage_error(exc))
            return False
        if record.error_type == STORAGE_ERROR:
            assert record.error_message is not None
            self.outcome.halted = _storage_halt(run_dir, record.error_message)
            return False
        return True

    def _count(self, record: JournalRecord) -> None:
        self.outcome.dispatched += 1
        self.done += 1
        if record.status == "failed":
            self.failed += 1
        elif passes(record.status, record.reward, self.prepared.config.evaluation.pass_threshold):
            self.passed += 1
        self.log.info(
            "row %d run %d: %s",
            record.row_index,
            record.run_index,
            record.status,
            extra={"step": "rollout"},
        )
        progress = ItemProgress(self.done, self.outcome.total, self.passed, self.failed)
        self.hooks.item_finished(record, progress)

    async def run_items(self, row_index: int, runs: tuple[int, ...]) -> list[JournalRecord]:
        """Runs ``runs`` of one row at once, to their journal records (not yet stored); under
        the group judge, their rewards are its scores of them against each other."""
        attempts = [_Attempt(self.by_row[row_index], run_index) for run_index in runs]
        ended = await asyncio.gather(*(self._run(attempt) for attempt in attempts))
        results = [result for result in ended if not isinstance(result, JournalRecord)]
        judge, config = self.stack.gateway.judge, self.prepared.config.judge
        if self._group_judged and judge is not None and config is not None:
            results = await judge_group(
                judge,
                config,
                results,
                label=attempts[0].item.label,
                files=self.outcome.run_dir / "rollout_trials",
            )
        judged = iter(results)
        return [
            result
            if isinstance(result, JournalRecord)
            else self._result_record(attempt, next(judged))
            for attempt, result in zip(attempts, ended, strict=True)
        ]

    async def _run(self, attempt: _Attempt) -> RolloutResultResponse | JournalRecord:
        """One rollout of one item: its result, or its failed record when it has none."""
        if attempt.item.error is not None:
            # Found unsendable when the dataset was read (named by file and row): the row
            # fails alone, nothing is sent, and the other rows run.
            return attempt.record(
                "failed", error_type="validation_error", error_message=attempt.item.error
            )
        handle = await self._send(attempt)
        if isinstance(handle, JournalRecord):
            return handle
        try:
            async with asyncio.timeout(self._item_deadline):
                return await handle
        except TimeoutError:
            with contextlib.suppress(RolloutProtocolError):
                await handle.cancel()
            return attempt.record("failed", error_type="timeout")

    async def _send(self, attempt: _Attempt) -> RolloutHandle | JournalRecord:
        """Start the rollout; a refusal of this item (4xx) is its failed record."""
        gateway, evaluation, item = (
            self.stack.gateway,
            self.prepared.config.evaluation,
            attempt.item,
        )
        try:
            return await self.stack.client.run_rollout(
                item.prompt,
                gateway.chat_completions_url(attempt.rollout_id),
                attempt.rollout_id,
                llm_api_key=gateway.token,
                label=item.label,
                metadata=item.metadata,
                agent_timeout_sec=evaluation.agent_timeout_sec,
                grader_timeout_sec=evaluation.grader_timeout_sec,
                extra_fields={
                    "row_index": item.row_index,
                    "run_index": attempt.run_index,
                    "trajectory_report_url": gateway.trajectory_report_url(attempt.rollout_id),
                },
            )
        except RolloutProtocolError as exc:
            if exc.status_code is not None and 400 <= exc.status_code < 500:
                # The server's answer says what it refused (too large, too deep...) and why.
                return attempt.record(
                    "failed", error_type="rollout_protocol_error", error_message=str(exc)
                )
            raise

    def _result_record(self, attempt: _Attempt, result: RolloutResultResponse) -> JournalRecord:
        records = self.stack.gateway.records
        calls = records.calls(attempt.rollout_id)
        records.release(attempt.rollout_id)
        tokens = sum(int((call.usage or {}).get("total_tokens") or 0) for call in calls)
        if result.status is RolloutStatus.SUCCESS and not calls:
            self.outcome.without_calls += 1
        if result.status is not RolloutStatus.SUCCESS:
            error = (result.err_category.value if result.err_category else None) or "rollout_failed"
            return attempt.record(
                "failed", tokens=tokens, error_type=error, error_message=result.err_message or None
            )
        if result.err_message is not None:
            # A successful result carries a message only when the server could not store
            # the rollout's files: the item is not done until they exist.
            return attempt.record(
                "failed", tokens=tokens, error_type=STORAGE_ERROR, error_message=result.err_message
            )
        sample = result.sample
        if sample is not None and sample.remove_sample:
            return attempt.record("skipped", tokens=tokens)
        reward = sample.reward if sample is not None else None
        return attempt.record("success", tokens=tokens, reward=reward)


async def run_eval(options: EvalOptions, hooks: EvalHooks | None = None) -> EvalOutcome:
    """Run (or resume) an evaluation; returns how it ended.

    ``hooks`` hear about it as it goes (see `EvalHooks`); ``run_dir_ready`` is awaited once
    the run directory exists, before anything is dispatched.

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
    hooks = hooks or QuietHooks()
    prepared = await asyncio.to_thread(prepare_run, options)
    say = partial(_say, hooks, prepared)
    run_dir = prepared.run_dir
    with contextlib.ExitStack() as held:
        await asyncio.to_thread(held.enter_context, run_lock(prepared.output_root, run_dir.name))
        manifest = await asyncio.to_thread(
            open_run_dir, run_dir, prepared.inputs, fresh=options.fresh
        )
        journal = Journal(run_dir / "events.jsonl")
        records = await asyncio.to_thread(_open_journal, journal)
        items = prepared.dataset.work_items(prepared.n)
        pending = pending_items(items, records, retry_failed=options.retry_failed)
        resumed = {key for key in records if key not in pending}
        outcome = EvalOutcome(run_dir.name, run_dir, total=len(items), resumed=len(resumed))
        await hooks.run_dir_ready(run_dir)
        hooks.plan(_plan(prepared, items, pending, resumed))
        say(f"run {run_dir.name}: {len(pending)} of {len(items)} work items to run")
        try:
            if pending:
                # Every osmosis_ai log record of this process is scrubbed of the run's keys too.
                with registered_secrets(prepared.keys.redactor.secrets):
                    await _dispatch(prepared, options, journal, outcome, pending, hooks)
        finally:
            projection = partial(_project, prepared, manifest, journal, items, resumed)
            await _finish(prepared, outcome, projection)
    return outcome


def _say(hooks: EvalHooks, prepared: PreparedRun, text: str) -> None:
    hooks.message(prepared.keys.redactor.text(text))


def _plan(
    prepared: PreparedRun, items: list[Item], pending: list[Item], resumed: set[Item]
) -> dict[str, str]:
    # Nothing here holds a key: the model is shown without URL credentials.
    config, dataset = prepared.config, prepared.dataset
    return {
        "Rollout": f"{config.experiment.rollout} ({config.entrypoint_path.name})",
        "Model": prepared.model_label,
        "Dataset": f"{dataset.path.name} ({dataset.path})",
        "Rows": f"{len(dataset.items)} of {dataset.total_rows}",
        "Runs per row": str(prepared.n),
        "Work items": f"{len(items)} ({len(pending)} to run, {len(resumed)} done)",
        "Output": str(prepared.run_dir),
    }


def _open_journal(journal: Journal) -> dict[Item, JournalRecord]:
    journal.open()
    return journal.replay()


def _server(
    prepared: PreparedRun, options: EvalOptions, log: logging.Logger
) -> RolloutServerProcess:
    config, secrets, run_dir = prepared.config, prepared.secrets, prepared.run_dir
    environment = config.environment
    return RolloutServerProcess(
        rollout_dir=config.rollout_dir,
        entrypoint=config.entrypoint_path.name,
        python=environment.python if environment else None,
        env={
            **config.env,
            **(
                server_env(
                    environment, config.workspace, config.env, max_tokens=environment.max_tokens
                )
                if environment
                else {}
            ),
            **secrets,
            SECRET_ENV_NAMES_ENV: ",".join(sorted(secrets)),
            # Live previews of in-flight rollouts, for `osmosis view`.
            PREVIEW_ROOT_ENV: str((run_dir / PREVIEWS_DIR).resolve()),
            BACKEND_ENV: options.backend,
            # An item counts as done once its trajectory is stored: it must outlive a crash.
            DURABLE_FILES_ENV: "1",
        },
        artifact_root=run_dir / "rollout_trials",
        log=lambda line: log.info("%s", line, extra={"step": "rollout-server"}),
        redact=prepared.keys.redactor.text,
        withheld=prepared.keys.policy,
        request_logs=options.request_logs,
    )


def _concurrency(prepared: PreparedRun, options: EvalOptions, capacity: int | None) -> int:
    wanted = (
        options.max_in_flight
        or prepared.config.evaluation.batch_size
        or capacity
        or _DEFAULT_CONCURRENCY
    )
    return min(wanted, capacity) if capacity else wanted


async def _dispatch(
    prepared: PreparedRun,
    options: EvalOptions,
    journal: Journal,
    outcome: EvalOutcome,
    pending: list[Item],
    hooks: EvalHooks,
) -> None:
    keys, say = prepared.keys, partial(_say, hooks, prepared)
    with run_log(outcome.run_dir / "logs.txt", keys.redactor) as log:
        try:
            async with rollout_stack(
                prepared.policy,
                _server(prepared, options, log),
                token=keys.rollout,
                secrets=prepared.secrets.values(),
                model_label=prepared.model_label,
                log=log,
                say=say,
                judge=prepared.judge,
            ) as stack:
                concurrency = _concurrency(prepared, options, stack.capacity)
                say(f"running {len(pending)} work items, up to {concurrency} in flight")
                run = EvalRun(prepared, stack, journal, outcome, log, hooks, done=outcome.resumed)
                try:
                    await run.supervise(pending, concurrency)
                finally:
                    if prepared.judge is not None:
                        say(f"judge {prepared.judge.label}: {prepared.judge.usage.line()}")
        except RolloutStackError as exc:
            outcome.halted = str(exc)
        finally:
            if outcome.halted:
                outcome.halted = keys.redactor.text(outcome.halted)


def _project(
    prepared: PreparedRun,
    manifest: dict[str, Any],
    journal: Journal,
    items: list[Item],
    resumed: set[Item],
) -> Any:
    config = prepared.config
    return write_projections(
        prepared.run_dir,
        manifest=manifest,
        records=journal.replay(),
        items=items,
        dataset=prepared.dataset,
        resumed_keys=resumed,
        pass_threshold=config.evaluation.pass_threshold,
        model_name=prepared.model_label,
        rollout_name=config.experiment.rollout,
    )


async def _finish(
    prepared: PreparedRun, outcome: EvalOutcome, projection: Callable[[], Any]
) -> None:
    """Rebuild the projections, then scrub the whole run directory, copies included."""
    try:
        finished = await asyncio.to_thread(projection)
    except OSError as exc:
        # The journal stays the authority: the next run rebuilds these files.
        outcome.halted = outcome.halted or _storage_halt(
            outcome.run_dir, describe_storage_error(exc)
        )
    else:
        outcome.metrics = finished.metrics
        outcome.failed_rows = finished.failed_rows
        outcome.complete = finished.complete
    stuck = await asyncio.to_thread(prepared.keys.scrub, outcome.run_dir)
    if stuck:  # what resists stops the run
        outcome.complete = False
        outcome.halted = (
            f"{len(stuck)} file(s) could be neither scrubbed of the run's keys nor deleted, "
            f"e.g. {stuck[0]}; delete them by hand"
        )
