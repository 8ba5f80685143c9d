"""Asynchronous training side by side: ``max_staleness`` 0, 1 and 2 on the calculator task
with slow tools (``async_task/slow_tools.py``: a seeded lognormal wait at the start of each
rollout and at each tool call, and partial credit for near answers, so that every step
updates), the embedded model and the torch engine.

Every setting runs the same seeds with the same hyper-parameters and trains on the same
number of groups (``--steps`` × 4 rows × 4 rollouts). The synchronous baseline (S = 0) runs
a step's rollouts concurrently, as ``osmosis train`` always does. Per profile, S and seed it
prints: the wall-clock of the steps, the wall-clock to reach the synchronous run's final
held-out reward (its evaluations every ``--eval-every`` steps, greedy, without tool waits),
the final held-out reward, staleness, the learner's and generator's idle fractions, the
steps that updated, and the bound on what overlap can win (the synchronous run's step time
over its engine's busy time plus its updates: they share the cores).

    python benchmarks/async_training.py                       # heavy and light, 3 seeds
    python benchmarks/async_training.py --profile heavy --seeds 0
    python benchmarks/async_training.py --median-sec 3 --sigma 0.5   # a profile of your own
    python benchmarks/async_training.py --engine vllm --seeds 0 --staleness 0 1

Run it on an otherwise idle machine: the generator and the update share the CPU's cores.
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

from train import VLLM_PYTHON, train_example, vllm_settings

SLOW_TOOLS = Path(__file__).resolve().parent / "async_task" / "slow_tools.py"
#: name: (median seconds of a wait, σ of its log)
PROFILES = {"light": (1.5, 1.0), "heavy": (5.0, 1.0)}


@dataclass(frozen=True)
class Result:
    profile: str
    staleness: int
    seed: int
    steps_sec: float
    """Wall-clock from the first step's start to the last step's end."""
    evals: list[tuple[int, float]]
    """(step, held-out mean reward)."""
    elapsed: dict[int, float]
    """Wall-clock at the end of each step."""
    staleness_mean: float
    staleness_max: int
    learner_idle: float
    """Share of the steps' time the learner's thread (which the torch engine generates on)
    did neither the update nor generation."""
    rollout_wait: float
    """Share of the steps' time the consumer waited for rollouts."""
    generator_idle: float
    """Share of the steps' time the engine had no call to generate."""
    overlap_bound: float
    """The most overlap could win on this run's steps: step time over the engine's busy time
    plus the update (they share the cores), from a synchronous run."""
    updates: int
    """Steps that trained on any token (a step whose groups all have equal rewards has none)."""

    @property
    def final_reward(self) -> float:
        return self.evals[-1][1]

    def seconds_to(self, reward: float) -> float | None:
        """Wall-clock at the first evaluation reaching ``reward`` (None: never)."""
        for step, value in self.evals:
            if step and value >= reward - 1e-9:
                return self.elapsed[step]
        return None


def _use_slow_tools(workspace: Path) -> None:
    """The copied example serves ``slow_tools.py`` (settings from the config's ``[env]``)."""
    shutil.copy(SLOW_TOOLS, workspace / "rollouts" / "calculator" / SLOW_TOOLS.name)
    config = workspace / "configs" / "training" / "calculator.toml"
    text = config.read_text().replace('entrypoint = "main.py"', 'entrypoint = "slow_tools.py"')
    config.write_text(text)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _run(args: argparse.Namespace, profile: str, staleness: int, seed: int, tmp: Path) -> Result:
    median, sigma = (args.median_sec, args.sigma) if profile == "custom" else PROFILES[profile]
    settings = {
        "training.steps": str(args.steps),
        "training.max_minutes": "0",
        "training.prompts_per_step": "4",
        "training.group_size": "4",
        "training.seed": str(seed),
        "training.max_staleness": str(staleness),
        "eval.rows": str(args.eval_rows),
        "eval.every": str(args.eval_every),
        "checkpoints.every": str(args.steps),
        "env.BENCH_TOOL_MEDIAN_SEC": f'"{median}"',
        "env.BENCH_TOOL_SIGMA": f'"{sigma}"',
        "env.BENCH_SEED": f'"{seed}"',
    }
    if args.engine == "vllm":
        settings.update(vllm_settings(VLLM_PYTHON))
    workspace = tmp / f"{profile}-s{staleness}-seed{seed}"
    print(f"\n== {profile} (median {median:g} s, σ {sigma:g}), S = {staleness}, seed {seed}")
    run_dir, _, _ = train_example(workspace, settings, _use_slow_tools)
    metrics = _lines(run_dir / "metrics.jsonl")
    events = _lines(run_dir / "events.jsonl")
    shutil.rmtree(workspace, ignore_errors=True)
    return result_of(profile, staleness, seed, metrics, events, shared=args.engine == "torch")


def result_of(
    profile: str,
    staleness: int,
    seed: int,
    metrics: list[dict[str, Any]],
    events: list[dict[str, Any]],
    *,
    shared: bool,
) -> Result:
    """A run's figures from its metrics and journal lines; ``shared``: the engine generates on
    the learner's thread (the torch engine)."""
    evals = [(int(e["step"]), float(e["mean_reward"])) for e in events if e["event"] == "eval"]
    elapsed = {int(m["step"]): float(m["elapsed_sec"]) for m in metrics}
    stale = [m["staleness_mean"] for m in metrics if m["staleness_mean"] is not None]
    # Each step's span: from asking for its groups to the weights pushed and probed.
    wall = sum(m["generation_sec"] + m["sequences_sec"] + m["update_sec"] for m in metrics)
    busy = sum(m["policy_busy_sec"] for m in metrics)
    update = sum(m["update_sec"] for m in metrics)
    return Result(
        profile,
        staleness,
        seed,
        steps_sec=elapsed[max(elapsed)],
        evals=evals,
        elapsed=elapsed,
        staleness_mean=statistics.fmean(stale) if stale else 0.0,
        staleness_max=max((m["staleness_max"] or 0) for m in metrics),
        learner_idle=max(0.0, 1 - (update + (busy if shared else 0.0)) / wall),
        rollout_wait=sum(m["generation_sec"] for m in metrics) / wall,
        generator_idle=max(0.0, 1 - busy / wall),
        overlap_bound=wall / (busy + update),
        updates=sum(1 for m in metrics if m["tokens_trained"]),
    )


def _print(results: list[Result], steps: int) -> None:
    print(f"\nAsynchronous training: {steps} steps of 4 rows x 4 rollouts, per profile, S, seed")
    header = (
        f"{'profile':<8}{'S':>3}{'seed':>6}{'steps s':>10}{'speed-up':>10}{'to sync reward s':>18}"
        f"{'final reward':>14}{'stale mean':>12}{'stale max':>11}{'learner idle':>14}"
        f"{'rollout wait':>14}{'engine idle':>13}{'updates':>9}{'bound':>8}"
    )
    print(header)
    sync = {(r.profile, r.seed): r for r in results if r.staleness == 0}
    for r in results:
        base = sync.get((r.profile, r.seed))
        speed = f"{base.steps_sec / r.steps_sec:.2f}x" if base else "-"
        reach = r.seconds_to(base.final_reward) if base else None
        print(
            f"{r.profile:<8}{r.staleness:>3}{r.seed:>6}{r.steps_sec:>10.1f}{speed:>10}"
            f"{(f'{reach:.1f}' if reach is not None else 'not reached'):>18}"
            f"{r.final_reward:>14.3f}{r.staleness_mean:>12.2f}{r.staleness_max:>11}"
            f"{r.learner_idle:>14.0%}{r.rollout_wait:>14.0%}{r.generator_idle:>13.0%}"
            f"{r.updates:>9}{(f'{base.overlap_bound:.2f}x' if base else '-'):>8}"
        )
    print("\nMeans over seeds")
    for profile in dict.fromkeys(r.profile for r in results):
        for staleness in sorted({r.staleness for r in results if r.profile == profile}):
            runs = [r for r in results if (r.profile, r.staleness) == (profile, staleness)]
            pairs = [(sync[(profile, r.seed)], r) for r in runs if (profile, r.seed) in sync]
            ratio = statistics.fmean(b.steps_sec for b, _ in pairs) / statistics.fmean(
                r.steps_sec for _, r in pairs
            )
            gap = statistics.fmean(r.final_reward - b.final_reward for b, r in pairs)
            seconds = statistics.fmean(r.steps_sec for r in runs)
            idle = statistics.fmean(r.learner_idle for r in runs)
            wait = statistics.fmean(r.rollout_wait for r in runs)
            bound = statistics.fmean(b.overlap_bound for b, _ in pairs)
            print(
                f"  {profile} S = {staleness}: steps {seconds:.1f} s, speed-up {ratio:.2f}x "
                f"(overlap bound {bound:.2f}x), final reward {gap:+.3f} vs sync, learner idle "
                f"{idle:.0%}, rollout wait {wait:.0%}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=[*PROFILES, "custom"], nargs="+",
                        default=["heavy", "light"])  # fmt: skip
    parser.add_argument("--median-sec", type=float, default=3.0, help="custom profile's median")
    parser.add_argument("--sigma", type=float, default=1.0, help="custom profile's σ")
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--eval-rows", type=int, default=16)
    parser.add_argument("--engine", choices=["torch", "vllm"], default="torch")
    args = parser.parse_args()
    if 0 not in args.staleness:
        parser.error("--staleness must include 0: the synchronous baseline")
    results = []
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-async-") as tmp:
        for profile in args.profile:
            for seed in args.seeds:
                for staleness in args.staleness:
                    results.append(_run(args, profile, staleness, seed, Path(tmp)))
                    _print(results, args.steps)


if __name__ == "__main__":
    main()
