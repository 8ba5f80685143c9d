"""Environments users already have, trained from a config alone (``make bench-environments``;
docs/environments.md, "Measured").

SmolLM2-135M-Instruct (the embedded model, torch engine) trained on

1. reasoning-gym's ``chain_sum`` (two one-digit terms; ``examples/reasoning_gym`` as shipped:
   150 different questions, 40 of them held out), and
2. an OpenEnv environment, ``examples/openenv``'s number guessing (three tries with
   "higher"/"lower" hints, a reward per step, credit per turn; 20 episodes held out), served
   from the example's module by ``.venv-openenv``'s Python (``make install-openenv``),

for ``--steps`` steps from each of ``--seeds``. Per run: the held-out pass rate and mean
reward before the first step and after the last (greedy), and the median wall-clock of a
step (rollouts, sequences, update).

    python benchmarks/environments.py                    # both, 20 steps, seeds 0 1 2
    python benchmarks/environments.py --envs openenv --steps 10 --seeds 0

Each row prints as its run ends; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train import train_example

ROOT = Path(__file__).resolve().parents[1]
OPENENV_PYTHON = ROOT / ".venv-openenv" / "bin" / "python"
#: name -> (example folder, its training config, ``--set`` keys of its own).
ENVIRONMENTS: dict[str, tuple[Path, Path, dict[str, str]]] = {
    "reasoning_gym": (
        ROOT / "examples" / "reasoning_gym",
        Path("configs") / "training" / "chain_sum.toml",
        {},
    ),
    "openenv": (
        ROOT / "examples" / "openenv",
        Path("configs") / "training" / "guess.toml",
        # The example names it relative to the repository; the copy runs elsewhere.
        {"environment.python": json.dumps(str(OPENENV_PYTHON))},
    ),
}


@dataclass(frozen=True)
class Run:
    environment: str
    seed: int
    pass_before: float
    pass_after: float
    reward_before: float
    reward_after: float
    step_sec: float
    """Median wall-clock of a step: a step stalled by other work moves it less than a mean."""


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _run(name: str, seed: int, steps: int, tmp: Path) -> Run:
    example, config, keys = ENVIRONMENTS[name]
    settings = {
        "training.steps": str(steps),
        "training.seed": str(seed),
        "training.max_minutes": "0",
        "eval.every": str(steps),
        "checkpoints.every": str(steps),
        **keys,
    }
    workspace = tmp / f"{name}-seed{seed}"
    print(f"\n== {name}, seed {seed}", flush=True)
    run_dir, _, _ = train_example(workspace, settings, example=example, config=config)
    metrics = _lines(run_dir / "metrics.jsonl")
    evals = [e for e in _lines(run_dir / "events.jsonl") if e["event"] == "eval"]
    shutil.rmtree(workspace, ignore_errors=True)
    seconds = [m["generation_sec"] + m["sequences_sec"] + m["update_sec"] for m in metrics]
    run = Run(
        name,
        seed,
        pass_before=float(evals[0]["pass_rate"]),
        pass_after=float(evals[-1]["pass_rate"]),
        reward_before=float(evals[0]["mean_reward"]),
        reward_after=float(evals[-1]["mean_reward"]),
        step_sec=statistics.median(seconds),
    )
    print(f"RESULT {json.dumps(run.__dict__)}", flush=True)
    return run


def _print(runs: list[Run], steps: int) -> None:
    print(f"\n{steps} steps of 4 rows x 4 rollouts, SmolLM2-135M-Instruct, torch engine, CPU\n")
    print("| environment | seed | held-out pass before → after | mean reward before → after "
          "| s/step (median) |")  # fmt: skip
    print("|---|---|---|---|---|")
    for run in runs:
        print(
            f"| {run.environment} | {run.seed} | {run.pass_before:.3f} → {run.pass_after:.3f} "
            f"| {run.reward_before:.3f} → {run.reward_after:.3f} | {run.step_sec:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", choices=list(ENVIRONMENTS), default=list(ENVIRONMENTS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    if "openenv" in args.envs and not OPENENV_PYTHON.is_file():
        raise SystemExit("the OpenEnv run needs .venv-openenv: run `make install-openenv`")
    with tempfile.TemporaryDirectory(prefix="bench-environments-") as tmp:
        runs = [
            _run(name, seed, args.steps, Path(tmp)) for name in args.envs for seed in args.seeds
        ]
    _print(runs, args.steps)


if __name__ == "__main__":
    main()
