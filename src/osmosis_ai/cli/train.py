"""``osmosis train run``: train the policy on a workflow and grader (see docs/train/README.md)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from osmosis_ai.cli._asyncio import run
from osmosis_ai.cli._options import OsmosisTyper, set_option
from osmosis_ai.cli._output import error_exit, plain_console, silence_tqdm
from osmosis_ai.cli._view import watch_training

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID
    from rich.table import Table

    from osmosis_ai.train.loop.runner import EvalPoint, TrainOutcome

__all__ = ["train_app"]

train_app = OsmosisTyper(
    help="Train the policy on your AgentWorkflow and Grader (GRPO; CPU or GPU; full or LoRA).",
    no_args_is_help=True,
)


def _step_line(metrics: Mapping[str, Any]) -> str:
    """One step as one line: reward, pass rate, loss and where the time went."""

    def number(key: str, digits: int = 3) -> str:
        value = metrics.get(key)
        return "-" if value is None else f"{value:.{digits}f}"

    return (
        f"step {metrics['step']}: reward {number('reward_mean')} (std {number('reward_std')}), "
        f"pass {number('pass_rate', 2)}, loss {number('loss', 4)}, "
        f"grad {number('grad_norm')}, zero-gradient groups {metrics['zero_gradient_groups']}"
        f"{_resampled(metrics)}{_excluded(metrics)}, "
        f"time {number('generation_sec', 1)}s rollouts + {number('update_sec', 1)}s update"
        f"{_computed(metrics)}{_no_update(metrics)}"
    )


def _computed(metrics: Mapping[str, Any]) -> str:
    """The update's tokens computed against those trained on (shared prefixes once)."""
    forwarded, computed = metrics.get("tokens_forwarded"), metrics.get("tokens_computed")
    if not forwarded or computed is None:
        return ""
    return f", tokens computed {computed:,} of {forwarded:,}"


def _no_update(metrics: Mapping[str, Any]) -> str:
    reason = metrics.get("no_update")
    return f"; no update: {reason}" if reason else ""


def _excluded(metrics: Mapping[str, Any]) -> str:
    from osmosis_ai.train.loop.step import excluded_text

    excluded = metrics.get("excluded") or {}
    return f", left out {sum(excluded.values())} ({excluded_text(excluded)})" if excluded else ""


def _resampled(metrics: Mapping[str, Any]) -> str:
    count = metrics.get("resampled_groups") or 0
    return f" (after {count} resampled)" if count else ""


class _Hooks:
    """Prints the run's progress: one line per step and per held-out evaluation, and on a
    terminal a progress bar under them (plain lines only when the output is a pipe or file).
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress: Progress | None = None
        self.task: TaskID | None = None

    def message(self, text: str) -> None:
        self.console.print(text)

    def started(self, first_step: int, last_step: int) -> None:
        if not self.console.is_terminal:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self.progress = Progress(
            "training steps",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self.task = self.progress.add_task("steps", total=last_step, completed=first_step - 1)
        self.progress.start()

    def step_done(self, metrics: Mapping[str, Any]) -> None:
        # Printed through the bar's console, each line lands above the bar.
        self.console.print(_step_line(metrics))
        if self.progress is not None and self.task is not None:
            self.progress.advance(self.task)

    def close(self) -> None:
        """Take the bar down (before the results table or an error)."""
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def eval_done(self, point: EvalPoint) -> None:
        self.console.print(
            f"held-out after step {point.step}: pass rate {point.pass_rate:.2f}, "
            f"mean reward {point.mean_reward:.3f}{_pass_at_k(point)}"
        )


def _pass_at_k(point: EvalPoint) -> str:
    """``, pass@1 0.40, pass@2 0.55, ...`` (several samples per held-out row), or nothing."""
    return "".join(f", pass@{k} {value:.2f}" for k, value in point.pass_at_k.items())


def _render_results(outcome: TrainOutcome, console: Console) -> None:
    """The held-out table (the first and the last evaluation), then the run's verdict when
    its steps trained little or nothing (last, where the eye lands)."""
    from rich.text import Text

    if outcome.evals:
        console.print(_results_table(outcome))
    if outcome.verdict:
        console.print(Text.assemble(("warning:", "yellow"), f" {outcome.verdict}"))


def _results_table(outcome: TrainOutcome) -> Table:
    from rich.table import Table

    table = Table(title=f"held-out results ({outcome.run_dir})")
    rows = [("before", outcome.evals[0])]
    if len(outcome.evals) > 1:
        rows.append(("after", outcome.evals[-1]))
    ks = sorted({k for _, point in rows for k in point.pass_at_k})
    for column in ("", "step", "pass rate", "mean reward", *(f"pass@{k}" for k in ks)):
        table.add_column(column)
    for label, point in rows:
        at_k = [point.pass_at_k.get(k) for k in ks]
        table.add_row(
            label,
            str(point.step),
            f"{point.pass_rate:.2f}",
            f"{point.mean_reward:.3f}",
            *("-" if value is None else f"{value:.2f}" for value in at_k),
        )
    return table


@train_app.command("run")
def run_command(
    config: Path = typer.Argument(..., help="The training TOML (configs/training/<name>.toml)."),
    name: str | None = typer.Option(None, "--name", help="Run name (default: the config's stem)."),
    fresh: bool = typer.Option(False, "--fresh", help="Delete the run and start over."),
    backend: str = typer.Option(
        "local", "--backend", help="Where rollouts run, as for `osmosis eval run --backend`."
    ),
    view: bool = typer.Option(
        False, "--view", help="Serve the run viewer (127.0.0.1) while training, until Ctrl-C."
    ),
    verbose: bool = typer.Option(
        False,
        "--verbose",
        help="Keep per-request HTTP lines (agent frameworks' clients, access log) in logs.txt.",
    ),
    overrides: list[str] | None = set_option(),
    print_config: bool = typer.Option(
        False,
        "--print-config",
        help="Print the config as it resolves (recipe, file, --set flags), and train nothing.",
    ),
) -> None:
    """Train, resuming the run from its last checkpoint when it exists."""
    silence_tqdm()  # before transformers imports it: no library progress bars in our output
    from osmosis_ai.errors import ConfigError, OsmosisError
    from osmosis_ai.train.loop.runner import TrainingStopped, TrainOptions, run_training

    console = plain_console()
    if print_config:
        _print_config(config, tuple(overrides or ()), console)
        return
    options = TrainOptions(
        config_path=config,
        overrides=tuple(overrides or ()),
        name=name,
        fresh=fresh,
        backend=backend,
        request_logs=verbose,
    )
    hooks = _Hooks(console)
    try:

        def report(outcome: TrainOutcome) -> None:
            hooks.close()  # the bar goes before the table
            _render_results(outcome, console)

        training = (
            watch_training(options, hooks, console, report)
            if view
            else run_training(options, hooks)
        )
        try:
            outcome = run(training)
        finally:
            hooks.close()  # the bar goes before the table or the error is printed
    except KeyboardInterrupt:
        console.print("interrupted: run the same command to resume from the last checkpoint")
        raise typer.Exit(130) from None
    except TrainingStopped as exc:
        if exc.outcome is not None:  # the held-out results so far
            _render_results(exc.outcome, console)
        raise error_exit(str(exc), code=1) from None
    except (ConfigError, OsmosisError) as exc:
        raise error_exit(str(exc)) from None
    if not view:
        _render_results(outcome, console)


def _print_config(path: Path, overrides: tuple[str, ...], console: Console) -> None:
    """The resolved config on stdout (what the run writes to its ``config.toml``)."""
    from osmosis_ai.errors import ConfigError
    from osmosis_ai.train.config import load_train_config, resolved_toml

    try:
        config = load_train_config(path, overrides)
    except ConfigError as exc:
        raise error_exit(str(exc)) from None
    console.print(resolved_toml(config), end="", markup=False, highlight=False, soft_wrap=True)


@train_app.command("export")
def export_command(
    run: str = typer.Argument(
        ..., help="The run: its directory, or its name under .osmosis/train of this workspace."
    ),
    merged: Path = typer.Option(
        ..., "--merged", help="Directory to write: a standalone HuggingFace model."
    ),
    step: int | None = typer.Option(
        None, "--step", help="The checkpoint's step (default: newest)."
    ),
) -> None:
    """Write a checkpoint as a HuggingFace model directory (a LoRA adapter merged into its base)."""
    from osmosis_ai.errors import OsmosisError
    from osmosis_ai.train.learner.export import export_merged, find_checkpoint

    silence_tqdm()
    console = plain_console()
    try:
        checkpoint = find_checkpoint(run, step, workspace=Path.cwd())
        exported = export_merged(checkpoint, merged)
    except (OsmosisError, OSError) as exc:  # OSError: a full disk, a directory not writable
        raise error_exit(str(exc)) from None
    what = "LoRA adapter merged into its base" if exported.merged_adapter else "full weights"
    console.print(f"exported {checkpoint.name} ({what}) to {exported.directory}")
