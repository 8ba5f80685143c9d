"""The training recipes side by side, on the embedded model and the torch engine (``make
bench-recipes``; docs/train/measurements.md, "Recipes").

1. The calculator task (``examples/calculator`` as shipped: exact-answer grading, 8 rollouts a
   row, 40 held-out rows; ``--grader close`` grades with partial credit, `CloseAnswer`), the
   same seeds, steps and rows for the ``[algorithm]`` defaults, each named recipe of
   `osmosis_ai.train.recipes.RECIPES` (``recipe = "grpo"``, ``"dr_grpo"``, ``"dapo"``,
   ``"gspo"``, ``"cispo"``, ``"rloo"``) and the defaults with 2 epochs × 2 mini-batches. Per
   recipe and seed: the held-out mean reward before and after (greedy), the held-out pass rate
   after, the median seconds per step and the largest later-update clip fraction; per
   recipe, its difference from the first (the defaults) and whether that difference is larger
   than the spread between seeds.
2. A multi-turn task with intermediate tool results (``recipes_task/chain.py``: three
   dependent calculator calls, each correct one rewarded as a turn): credit per turn (an
   ``[algorithm.turn_credit]`` table) against outcome credit, held-out success (exact final
   number) and mean reward after the steps.

    python benchmarks/recipes.py                        # both tables, seeds 0 1 2
    python benchmarks/recipes.py --table recipes --recipes gspo cispo --seeds 0
    python benchmarks/recipes.py --table credit --steps 6
    python benchmarks/recipes.py --table recipes --grader close --group-size 4 --eval-rows 16

Each row prints as its run ends; run it on an otherwise idle machine (the engine and the
update share the cores; seconds per step compare only within one run of this script).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from osmosis_ai.train.recipes import RECIPES
from recipes_task.chain_rows import chain_rows
from train import train_example

HERE = Path(__file__).resolve().parent
#: setting -> its ``--set`` keys (TOML values) over the common settings: the defaults, every
#: named recipe, and the defaults with several updates a step.
SETTINGS: dict[str, dict[str, str]] = {
    "defaults": {},
    **{name: {"algorithm.recipe": f'"{name}"'} for name in RECIPES},
    "defaults 2x2": {"algorithm.epochs": "2", "algorithm.mini_batches": "2"},
}
#: credit -> its keys: outcome (no table) or per turn (an ``[algorithm.turn_credit]`` table).
CREDITS: dict[str, dict[str, str]] = {
    "outcome": {},
    "turn": {"algorithm.turn_credit.discount": "0.5"},
}
#: Rollouts a row in the credit table (its figures in docs/train/measurements.md were measured
#: with 4).
CREDIT_GROUP_SIZE = 4


@dataclass(frozen=True)
class Run:
    table: str
    setting: str
    seed: int
    before: float
    """Held-out mean reward before the first step."""
    after: float
    pass_after: float
    step_sec: float
    """Median wall-clock of a step (rollouts, sequences, update): a step stalled by other
    work on the machine moves it less than a mean."""
    later_clip: float
    """Largest clip fraction of a step's later updates (0 with one update per step)."""


def _calculator(grader: str) -> Callable[[Path], None]:
    """The copied example as shipped, or grading with partial credit (`CloseAnswer`)."""

    def prepare(workspace: Path) -> None:
        if grader == "close":
            main = workspace / "rollouts" / "calculator" / "main.py"
            main.write_text(main.read_text().replace("grader=ExactAnswer", "grader=CloseAnswer"))

    return prepare


def _chain(workspace: Path) -> None:
    """The chain rollout and its rows: training rows and a held-out file of their own."""
    shutil.copy(HERE / "recipes_task" / "chain.py", workspace / "rollouts" / "calculator")
    data = workspace / "data"
    for name, count, seed in (("chain_train.jsonl", 96, 7), ("chain_eval.jsonl", 16, 1007)):
        rows = chain_rows(count, seed)
        (data / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = workspace / "configs" / "training" / "calculator.toml"
    text = config.read_text().replace('entrypoint = "main.py"', 'entrypoint = "chain.py"')
    config.write_text(text.replace("data/arithmetic_train.jsonl", "data/chain_train.jsonl"))


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _run(
    args: argparse.Namespace,
    table: str,
    setting: str,
    seed: int,
    keys: dict[str, str],
    prepare: Callable[[Path], None],
    tmp: Path,
) -> Run:
    settings = {
        "training.steps": str(args.steps),
        "training.max_minutes": "0",
        "training.prompts_per_step": "4",
        "training.group_size": str(args.group_size if table == "recipes" else CREDIT_GROUP_SIZE),
        "training.seed": str(seed),
        "eval.every": str(args.steps),
        "checkpoints.every": str(args.steps),
        **keys,
    }
    if table == "credit":  # replaces the file's [eval] rows (the run says so)
        settings["eval.dataset"] = '"data/chain_eval.jsonl"'
        settings["sampling.max_tokens"] = "64"
    else:
        settings["eval.rows"] = str(args.eval_rows)
    workspace = tmp / f"{table}-{setting.replace(' ', '-')}-seed{seed}"
    print(f"\n== {table}: {setting}, seed {seed}", flush=True)
    run_dir, _, _ = train_example(workspace, settings, prepare)
    metrics = _lines(run_dir / "metrics.jsonl")
    evals = [e for e in _lines(run_dir / "events.jsonl") if e["event"] == "eval"]
    shutil.rmtree(workspace, ignore_errors=True)
    later = [
        max(list((m.get("clip_fraction_by_update") or {}).values())[1:], default=0.0)
        for m in metrics
    ]
    seconds = [m["generation_sec"] + m["sequences_sec"] + m["update_sec"] for m in metrics]
    run = Run(
        table,
        setting,
        seed,
        before=float(evals[0]["mean_reward"]),
        after=float(evals[-1]["mean_reward"]),
        pass_after=float(evals[-1]["pass_rate"]),
        step_sec=statistics.median(seconds),
        later_clip=max(later, default=0.0),
    )
    print(f"RESULT {json.dumps(run.__dict__)}", flush=True)
    return run


def _print(runs: list[Run], args: argparse.Namespace) -> None:
    for table, title in (
        (
            "recipes",
            f"calculator ({args.grader} answer), {args.steps} steps of 4 rows x "
            f"{args.group_size} rollouts, {args.eval_rows} held out, greedy",
        ),
        (
            "credit",
            f"chain of three calls, {args.steps} steps of 4 rows x {CREDIT_GROUP_SIZE} "
            "rollouts, 16 held out",
        ),
    ):
        rows = [r for r in runs if r.table == table]
        if not rows:
            continue
        print(f"\n{title}")
        print(
            f"{'setting':<14}{'seed':>5}{'reward before':>15}{'reward after':>14}"
            f"{'pass after':>12}{'s/step':>9}{'later clip':>12}"
        )
        for r in rows:
            print(
                f"{r.setting:<14}{r.seed:>5}{r.before:>15.3f}{r.after:>14.3f}"
                f"{r.pass_after:>12.1%}{r.step_sec:>9.1f}{r.later_clip:>12.1%}"
            )
        print("means over seeds")
        settings = list(dict.fromkeys(r.setting for r in rows))
        for setting in settings:
            mine = [r for r in rows if r.setting == setting]
            gain = statistics.fmean(r.after - r.before for r in mine)
            above = sum(r.after > r.before for r in mine)
            print(
                f"  {setting:<14} after {statistics.fmean(r.after for r in mine):.3f} "
                f"(before {statistics.fmean(r.before for r in mine):.3f}, {gain:+.3f}; above "
                f"the untrained model in {above} of {len(mine)} seeds), pass after "
                f"{statistics.fmean(r.pass_after for r in mine):.1%}, "
                f"{statistics.fmean(r.step_sec for r in mine):.1f} s/step"
            )
        reference = settings[0]
        print(f"against {reference} (difference of the means after; seed spread: the larger "
              "of the two settings' standard deviations over seeds)")  # fmt: skip
        for setting in settings[1:]:
            print(f"  {setting:<14} {_against(rows, reference, setting)}")


def _against(rows: list[Run], reference: str, setting: str) -> str:
    """``setting``'s held-out reward after training against ``reference``'s: the difference
    of their means over seeds, and whether it is larger than the spread between seeds (the
    larger sample standard deviation of the two): a difference inside it is noise."""
    theirs = [r.after for r in rows if r.setting == reference]
    mine = [r.after for r in rows if r.setting == setting]
    if min(len(theirs), len(mine)) < 2:
        return "needs two seeds of each to tell a difference from noise"
    difference = statistics.fmean(mine) - statistics.fmean(theirs)
    spread = max(statistics.stdev(theirs), statistics.stdev(mine))
    verdict = "exceeds seed noise" if abs(difference) > spread else "within seed noise"
    return f"{difference:+.3f} (seed spread {spread:.3f}): {verdict}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", choices=["recipes", "credit"], nargs="+",
                        default=["recipes", "credit"])  # fmt: skip
    parser.add_argument("--recipes", choices=list(SETTINGS), nargs="+", default=list(SETTINGS))
    parser.add_argument("--credits", choices=CREDITS, nargs="+", default=list(CREDITS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--eval-rows", type=int, default=40, help="held out (recipes table)")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts a row (recipes)")
    parser.add_argument("--grader", choices=["exact", "close"], default="exact",
                        help="the calculator's grading (recipes table)")  # fmt: skip
    args = parser.parse_args()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-recipes-") as tmp:
        if "recipes" in args.table:
            for seed in args.seeds:
                for recipe in args.recipes:
                    keys = SETTINGS[recipe]
                    prepare = _calculator(args.grader)
                    runs.append(_run(args, "recipes", recipe, seed, keys, prepare, Path(tmp)))
                    _print(runs, args)
        if "credit" in args.table:
            for seed in args.seeds:
                for credit in args.credits:
                    keys = CREDITS[credit]
                    runs.append(_run(args, "credit", credit, seed, keys, _chain, Path(tmp)))
                    _print(runs, args)


if __name__ == "__main__":
    main()
