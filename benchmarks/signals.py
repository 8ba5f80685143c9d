"""Signals from models on the calculator (``make bench-signals``; docs/train/measurements.md,
"Signals from models"): on-policy distillation against GRPO, and a judge against the
exact-answer grader. The embedded model and the torch engine, as the example ships.

1. **Distillation.** A teacher is trained first (the training demo's config for
   ``--teacher-steps`` steps; or ``--teacher DIR``, a checkpoint of it). Then, from the base
   model, for each seed: ``--steps`` steps of GRPO (the example as shipped: exact-answer
   rewards) and ``--steps`` steps of on-policy distillation from the teacher
   (``[algorithm.distill]``, the reward's advantage left out). Per run: the held-out pass
   rate before and after (greedy, ``--held-out`` rows, 40 by default), the median seconds
   per step, the reverse KL to the teacher at the first and the last step (GRPO runs: not
   measured) and the teacher's seconds per step.
2. **A judge.** The calculator graded by the embedded model as a judge (`JudgeGrader`, the
   rubric of ``CALCULATOR_GRADER=judge``, the row's answer as reference) against the exact
   answer: ``osmosis eval`` of the example's 24 eval rows with the judge, and the agreement of its
   grades (score ≥ 0.5) with the exact grader's on the same replies; then ``--steps`` steps
   of training graded by each, with the held-out pass rate by exact answer after each
   (re-graded from the held-out rollouts' trajectories, so both runs are measured alike).

    python benchmarks/signals.py                       # both tables, seeds 0 1 2
    python benchmarks/signals.py --table distill --teacher path/to/checkpoints/step-0008
    python benchmarks/signals.py --table judge --steps 4

Each run prints as it ends (``RESULT`` lines); run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train import EXAMPLE, OSMOSIS, train_example

JUDGE_SECTION = '\n[judge]\nmodel = "embedded"\nmax_tokens = 200\nconcurrency = 2\n'


def _example_module() -> Any:
    """The calculator example's rollout module (its `final_number`: the exact grader's reading
    of a reply), loaded from the example with the exact grader."""
    path = EXAMPLE / "rollouts" / "calculator" / "main.py"
    spec = importlib.util.spec_from_file_location("calculator_main", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CALCULATOR = _example_module()


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _appending(text: str) -> Callable[[Path], None]:
    def prepare(workspace: Path) -> None:
        config = workspace / "configs" / "training" / "calculator.toml"
        config.write_text(config.read_text() + text)

    return prepare


def _settings(steps: int, seed: int, held_out: int) -> dict[str, str]:
    return {
        "training.steps": str(steps),
        "training.max_minutes": "0",
        "training.seed": str(seed),
        "eval.rows": str(held_out),
        "eval.every": str(steps),
        "checkpoints.every": str(steps),
    }


def _exact(messages: list[dict[str, Any]], label: str) -> bool:
    answer = CALCULATOR.final_number(messages)
    return answer is not None and answer == float(label)


def _conversation(trajectory: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A rollout's chat messages (its trajectory's steps, as the exact grader reads them) and
    its ``extra.osmosis`` (label, sample metrics)."""
    document = json.loads(trajectory.read_text())
    messages = [
        {"role": "assistant" if step["source"] == "agent" else step["source"],
         "content": step.get("message") or ""}
        for step in document["steps"]
    ]  # fmt: skip
    return messages, document["extra"]["osmosis"]


def _replies(run_dir: Path, prefix: str) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """`_conversation` of each rollout of a training run whose id starts with ``prefix``."""
    paths = sorted((run_dir / "rollouts").glob(f"{prefix}*/trajectory.json"))
    return [_conversation(path) for path in paths]


def _held_out_exact(run_dir: Path, step: int) -> float:
    """The held-out pass rate after ``step`` by exact answer, whatever graded the run."""
    replies = _replies(run_dir, f"eval-{step:04d}-")
    passed = [_exact(messages, str(extra.get("label"))) for messages, extra in replies]
    return sum(passed) / len(passed) if passed else float("nan")


@dataclass(frozen=True)
class Run:
    table: str
    setting: str
    seed: int
    before: float
    after: float
    step_sec: float
    kl_first: float | None = None
    kl_last: float | None = None
    teacher_sec: float | None = None
    judge_sec: float | None = None


def _train(
    args: argparse.Namespace, tmp: Path, table: str, setting: str, seed: int, extra: str
) -> tuple[Run, Path]:
    print(f"\n== {table}: {setting}, seed {seed}", flush=True)
    steps = args.steps
    workspace = tmp / f"{table}-{setting.replace(' ', '-')}-seed{seed}"
    settings = _settings(steps, seed, args.held_out)
    run_dir, _, _ = train_example(workspace, settings, _appending(extra))
    metrics = _lines(run_dir / "metrics.jsonl")
    kls = [m["teacher_reverse_kl"] for m in metrics if m.get("teacher_reverse_kl") is not None]
    seconds = [m["generation_sec"] + m["sequences_sec"] + m["update_sec"] for m in metrics]
    teacher = [m["teacher_sec"] for m in metrics if "teacher_sec" in m]
    judge = [m["judge_seconds"] for m in metrics if "judge_seconds" in m]
    run = Run(
        table,
        setting,
        seed,
        before=_held_out_exact(run_dir, 0),
        after=_held_out_exact(run_dir, steps),
        step_sec=statistics.median(seconds),
        kl_first=kls[0] if kls else None,
        kl_last=kls[-1] if kls else None,
        teacher_sec=statistics.fmean(teacher) if teacher else None,
        judge_sec=statistics.fmean(judge) if judge else None,
    )
    print(f"RESULT {json.dumps(asdict(run))}", flush=True)
    return run, run_dir


def _teacher(args: argparse.Namespace, tmp: Path) -> Path:
    if args.teacher is not None:
        return Path(args.teacher).resolve()
    print(f"\n== teacher: the training demo for {args.teacher_steps} steps", flush=True)
    settings = _settings(args.teacher_steps, 0, args.held_out)
    run_dir, wall, _ = train_example(tmp / "teacher", settings)
    checkpoint = (run_dir / "checkpoints" / "latest").resolve()
    evals = [e for e in _lines(run_dir / "events.jsonl") if e["event"] == "eval"]
    print(
        f"TEACHER {checkpoint}: held-out pass {evals[0]['pass_rate']:.1%} -> "
        f"{evals[-1]['pass_rate']:.1%} in {wall:.0f} s",
        flush=True,
    )
    kept = tmp.parent / "signals-teacher"
    shutil.rmtree(kept, ignore_errors=True)
    shutil.copytree(checkpoint, kept)
    return kept


def distillation(args: argparse.Namespace, tmp: Path) -> list[Run]:
    teacher = _teacher(args, tmp)
    runs = []
    for seed in args.seeds:
        runs.append(_train(args, tmp, "distill", "grpo", seed, "")[0])
        distill = f'\n[algorithm.distill]\nteacher = "{teacher}"\n'
        runs.append(_train(args, tmp, "distill", "distill", seed, distill)[0])
    return runs


@dataclass(frozen=True)
class Agreement:
    replies: int
    agree: int
    """Replies the judge graded as the exact grader did (score >= 0.5 is a pass)."""
    right: int
    """Replies right by exact answer."""
    failed: int
    """Replies the judge gave no valid score (``judge_error``)."""
    judge_sec: float
    """The judge's seconds per graded reply."""


def _judge_agreement(tmp: Path) -> Agreement:
    """``osmosis eval`` of the example's eval rows (24) graded by the judge, against the exact
    grader."""
    workspace = tmp / "judge-eval"
    shutil.copytree(EXAMPLE, workspace, ignore=shutil.ignore_patterns(".osmosis"))
    config = workspace / "configs" / "eval" / "calculator.toml"
    config.write_text(config.read_text() + JUDGE_SECTION + '[env]\nCALCULATOR_GRADER = "judge"\n')
    # Exits 3 when every rollout failed: a judge that answers nothing valid is a result here.
    subprocess.run(
        [OSMOSIS, "eval", "run", str(config), "--name", "j"],
        cwd=workspace,
        check=False,
    )
    run_dir = workspace / ".osmosis" / "evals" / "j"
    agree = right = failed = 0
    seconds = []
    rows = _lines(run_dir / "index.jsonl")
    for row in rows:
        trial = run_dir / "rollout_trials" / row["rollout_id"]
        messages, extra = _conversation(trial / "trajectory.json")
        exact = _exact(messages, str(extra.get("label")))
        right += exact
        if row.get("error_type") == "judge_error":
            failed += 1
            continue
        agree += exact == ((row.get("reward") or 0.0) >= 0.5)
        seconds.append(extra["sample_metrics"].get("judge_seconds", 0.0))
    found = Agreement(len(rows), agree, right, failed, statistics.fmean(seconds or [0.0]))
    print(f"AGREEMENT {json.dumps(asdict(found))}", flush=True)
    return found


def judging(args: argparse.Namespace, tmp: Path) -> list[Run]:
    found = _judge_agreement(tmp)
    print(
        f"\njudge (embedded) on {found.replies} eval replies of the base model: agrees "
        f"with the exact answer on {found.agree}, no valid score on {found.failed}; "
        f"{found.right} are right by exact answer; {found.judge_sec:.1f} s of judge per reply",
        flush=True,
    )
    runs = []
    for seed in args.seeds[:1]:
        runs.append(_train(args, tmp, "judge", "exact", seed, "")[0])
        judge = JUDGE_SECTION + '\n[env]\nCALCULATOR_GRADER = "judge"\n'
        runs.append(_train(args, tmp, "judge", "judge", seed, judge)[0])
    return runs


def _print(runs: list[Run]) -> None:
    print("\nsetting  seed  held-out exact pass before -> after  s/step  KL first -> last  "
          "teacher s/step  judge s/step")  # fmt: skip
    for r in runs:
        kl = f"{r.kl_first:.3f} -> {r.kl_last:.3f}" if r.kl_first is not None else "-"
        print(
            f"{r.table}/{r.setting:<8} {r.seed:>3}  {r.before:>6.1%} -> {r.after:<6.1%}  "
            f"{r.step_sec:>6.1f}  {kl}  {r.teacher_sec or 0:.1f}  {r.judge_sec or 0:.1f}"
        )
    for table, setting in sorted({(r.table, r.setting) for r in runs}):
        mine = [r for r in runs if (r.table, r.setting) == (table, setting)]
        print(
            f"mean {table}/{setting}: after {statistics.fmean(r.after for r in mine):.1%} "
            f"(before {statistics.fmean(r.before for r in mine):.1%}), "
            f"{statistics.fmean(r.step_sec for r in mine):.1f} s/step"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", choices=("distill", "judge", "both"), default="both")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--teacher", help="a checkpoint of the calculator to distil from")
    parser.add_argument("--teacher-steps", type=int, default=8)
    parser.add_argument("--held-out", type=int, default=40, help="held-out rows (greedy)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-signals-") as directory:
        tmp = Path(directory)
        runs: list[Run] = []
        if args.table in ("distill", "both"):
            runs += distillation(args, tmp)
        if args.table in ("judge", "both"):
            runs += judging(args, tmp)
        _print(runs)


if __name__ == "__main__":
    main()
