"""``osmosis eval run``: evaluate a rollout over a dataset, locally, resumably."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import typer

from osmosis_ai.cli._asyncio import run
from osmosis_ai.cli._logging import configure_logging
from osmosis_ai.cli._options import OsmosisTyper, set_option, upstream_timeout_option
from osmosis_ai.cli._output import error_exit, plain_console, silence_tqdm
from osmosis_ai.cli._view import keep_viewing, open_viewer

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from osmosis_ai.eval.hooks import ItemProgress
    from osmosis_ai.eval.journal import JournalRecord
    from osmosis_ai.eval.runner import EvalOptions, EvalOutcome

__all__ = ["eval_app"]

eval_app = OsmosisTyper(help="Evaluate rollouts locally.", no_args_is_help=True)

#: Distinct failures printed under the results (all of them are in the run's index).
_FAILURE_LINES = 20


def _render_results(outcome: Any, console: Any) -> None:
    from rich.table import Table

    summary = outcome.metrics.get("summary", {})
    table = Table(title=f"osmosis eval — {outcome.run_name}", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("work items", f"{summary.get('total_samples', 0)} of {outcome.total}")
    table.add_row("passed", str(summary.get("passed", 0)))
    table.add_row("failed", str(summary.get("failed", 0)))
    table.add_row("skipped", str(summary.get("skipped", 0)))
    table.add_row(
        "pass rate", f"{summary.get('pass_rate', 0):.1%} (reward ≥ {summary.get('pass_threshold')})"
    )
    stats = summary.get("reward_stats")
    if stats:
        table.add_row(
            "reward mean / median / std",
            f"{stats['mean']:.3f} / {stats['median']:.3f} / {stats['std']:.3f}",
        )
        table.add_row("reward min / max", f"{stats['min']:.3f} / {stats['max']:.3f}")
    for point in summary.get("pass_at_k") or []:
        table.add_row(f"pass@{point['k']}", f"{point['value']:.3f}")
    table.add_row("tokens", f"{summary.get('tokens_used', 0):,}")
    console.print(table)
    from osmosis_ai.eval.metrics import failure_lines

    for line in failure_lines(outcome.failed_rows)[:_FAILURE_LINES]:
        console.print(line, markup=False)
    console.print(f"results in {outcome.run_dir}", soft_wrap=True)


class _ConsoleHooks:
    """`EvalHooks` for the terminal: a live bar (or one line per item), steps, the plan.

    ``--view`` starts the viewer in ``stack`` once the run directory exists.
    """

    def __init__(
        self, console: Console, *, as_json: bool, view: bool, stack: contextlib.AsyncExitStack
    ) -> None:
        self.console, self.as_json, self.view, self.stack = console, as_json, view, stack
        self.interactive = console.is_terminal and not as_json
        self.progress = _progress(console, enabled=self.interactive)
        self.task_id = self.progress.add_task("rollouts", total=None, stats="")
        self.started = time.monotonic()

    async def run_dir_ready(self, run_dir: Path) -> None:
        if self.view:
            await open_viewer(
                self.stack, run_dir.parent, f"/run/{quote(run_dir.name)}", self.console
            )

    def plan(self, plan: Mapping[str, str]) -> None:
        if self.as_json:
            return
        from rich.text import Text

        width = max(map(len, plan), default=0)
        for key, value in plan.items():
            # Whole, however narrow the terminal: a path here is one a user copies.
            self.console.print(
                Text.assemble((f"{key:<{width}}", "bold"), "  ", value), soft_wrap=True
            )

    def message(self, text: str) -> None:
        if not self.as_json:
            self.console.print(f"→ {text}")

    def item_finished(self, record: JournalRecord, progress: ItemProgress) -> None:
        done, total = progress.done, progress.total
        if self.interactive:
            rate = done / max(time.monotonic() - self.started, 1e-9)
            stats = f"pass {progress.passed} · failed {progress.failed} · {rate:.1f}/s"
            self.progress.update(self.task_id, completed=done, total=total, stats=stats)
        elif not self.as_json:
            self.console.print(
                f"[{done}/{total}] row {record.row_index} run {record.run_index}: "
                f"{record.status} reward={record.reward} {record.error_type or ''}".rstrip()
            )


def _progress(console: Console, *, enabled: bool) -> Progress:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("rollouts"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
    )


def _report(outcome: EvalOutcome, console: Console, *, as_json: bool) -> None:
    if as_json:
        payload = {
            "run_name": outcome.run_name,
            "output_path": str(outcome.run_dir),
            "total_work_items": outcome.total,
            "dispatched": outcome.dispatched,
            "resumed": outcome.resumed,
            "complete": outcome.complete,
            "halted": outcome.halted,
            "metrics": outcome.metrics,
            "failed_rows": outcome.failed_rows,
            "warnings": outcome.warnings,
        }
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        sys.stdout.flush()
        return
    from rich.text import Text

    _render_results(outcome, console)
    for warning in outcome.warnings:
        console.print(Text.assemble(("warning:", "yellow"), f" {warning}"))
    if outcome.halted:
        # Resuming helps only once items have run; before that the message says what
        # to fix (an entry point that serves nothing is not fixed by re-running).
        advice = "; re-run to resume" if outcome.dispatched else ""
        console.print(Text.assemble(("stopped early:", "yellow"), f" {outcome.halted}{advice}"))


async def _evaluate(
    options: EvalOptions, console: Console, *, as_json: bool, view: bool
) -> EvalOutcome:
    """Run the eval with the terminal's hooks; with ``view``, report and keep serving."""
    from osmosis_ai.eval.runner import run_eval

    async with contextlib.AsyncExitStack() as stack:
        hooks = _ConsoleHooks(console, as_json=as_json, view=view, stack=stack)
        with hooks.progress:
            outcome = await run_eval(options, hooks)
        if view:
            _report(outcome, console, as_json=as_json)
            await keep_viewing(console)
        return outcome


def _backend_option() -> Any:
    """``--backend``: where rollouts run."""
    return typer.Option(
        "local",
        "--backend",
        help=(
            "Where rollouts run: local, ray (a local Ray instance), ray:ADDRESS, process "
            "(a child process per rollout) or process:sandbox (inside bubblewrap)."
        ),
    )


@eval_app.command("run")
def run_command(
    config: Path = typer.Argument(..., help="Eval config, e.g. configs/eval/calculator.toml."),
    name: str | None = typer.Option(None, "--name", help="Run name; re-running a name resumes it."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Output root."),
    model: str | None = typer.Option(
        None,
        "--model",
        help="Model to use instead of the config's model_path, e.g. torch:<checkpoint dir>.",
    ),
    dataset_file: Path | None = typer.Option(
        None, "--dataset-file", help="Dataset to use instead."
    ),
    rows: str | None = typer.Option(None, "--rows", help="Source rows, e.g. 3,7,10-20."),
    n: int | None = typer.Option(None, "--n", min=1, help="Runs per row (overrides the config)."),
    max_in_flight: int | None = typer.Option(None, "--max-in-flight", min=1, help="Concurrency."),
    fresh: bool = typer.Option(False, "--fresh", help="Archive earlier results and start over."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Re-run failed items too."),
    policy_api_key: str | None = typer.Option(
        None,
        "--policy-api-key",
        envvar="OSMOSIS_POLICY_API_KEY",
        help="Key for an openai-compatible model_path (LiteLLM reads its usual variables).",
    ),
    upstream_timeout: float | None = upstream_timeout_option(),
    yes: bool = typer.Option(False, "--yes", "-y", help="Accepted for compatibility."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
    verbose: bool = typer.Option(
        False,
        "--verbose",
        help="Log everything to the terminal, and keep per-request HTTP lines in logs.txt.",
    ),
    backend: str = _backend_option(),
    view: bool = typer.Option(
        False, "--view", help="Serve the run viewer (127.0.0.1) while running, until Ctrl-C."
    ),
    strict: bool = typer.Option(
        False,
        "--strict",
        help="Exit 3 when any rollout failed (without it, only when every rollout failed).",
    ),
    overrides: list[str] | None = set_option(),
) -> None:
    """Run the rollout over the dataset against the model, then print the results table.

    Exit status: 0 done; 1 stopped early (run again to resume); 2 a usage or config error;
    3 every rollout failed (errors, not low rewards), or any did under --strict; 130 Ctrl-C.
    """
    silence_tqdm()  # before transformers imports it (--model torch:...): no library bars
    from osmosis_ai.eval.runner import EvalOptions

    console = _prepare_terminal(name, verbose=verbose, as_json=as_json)
    options = EvalOptions(
        config_path=config,
        overrides=tuple(overrides or ()),
        name=name,
        output=output,
        model=model,
        dataset_file=dataset_file,
        rows=rows,
        n=n,
        max_in_flight=max_in_flight,
        fresh=fresh,
        retry_failed=retry_failed,
        policy_api_key=policy_api_key,
        upstream_timeout_sec=upstream_timeout,
        backend=backend,
        request_logs=verbose,
    )
    del yes  # local runs ask nothing; kept for compatibility with the reference CLI
    _run_and_report(options, console, as_json=as_json, view=view, strict=strict)


def _prepare_terminal(name: str | None, *, verbose: bool, as_json: bool) -> Console:
    """Check ``--name``, log to the terminal under ``--verbose``, and return the console
    (stderr under ``--json``, which keeps stdout for the outcome)."""
    if name is not None:
        _check_name(name)
    if verbose:
        configure_logging()
    return plain_console(stderr=as_json)


def _check_name(name: str) -> None:
    from osmosis_ai.errors import ConfigError
    from osmosis_ai.eval.run_dir import check_run_name

    try:
        check_run_name(name, label="--name")
    except ConfigError as exc:
        raise error_exit(str(exc)) from None


def _run_and_report(
    options: EvalOptions, console: Console, *, as_json: bool, view: bool, strict: bool
) -> None:
    """Run the eval, print its outcome and exit 1 unless it is complete, 3 when its rollouts
    failed (all of them, or under ``strict`` any)."""
    from osmosis_ai.errors import OsmosisError

    try:
        outcome = run(_evaluate(options, console, as_json=as_json, view=view))
    except KeyboardInterrupt:
        console.print("interrupted: in-flight items stay pending; run the same command to resume")
        raise typer.Exit(130) from None
    except OsmosisError as exc:
        raise error_exit(str(exc)) from None
    if not view:
        _report(outcome, console, as_json=as_json)
    if not outcome.complete:
        raise typer.Exit(1)
    failures = _failures(outcome, strict=strict)
    if failures:
        raise error_exit(failures, code=3)


def _failures(outcome: EvalOutcome, *, strict: bool) -> str | None:
    """The line that fails a complete run: every rollout failed (the rollouts could not run,
    which a pass rate of 0 would hide), or under ``strict`` any did; else None."""
    from osmosis_ai.eval.metrics import failure_line

    summary = outcome.metrics.get("summary", {})
    failed, total = summary.get("failed", 0), summary.get("total_samples", 0)
    if not failed or (failed < total and not strict):
        return None
    rows = outcome.failed_rows
    return failure_line(((row["error_type"], row["error_message"]) for row in rows), total)
