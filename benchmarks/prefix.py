"""A group's shared prompt computed once, and generation in bf16, measured (issue 58).

Run with ``make bench-prefix``, or ``python benchmarks/prefix.py [--repeats 3] [--steps 2]
[--groups 4 8] [--examples calculator openai_agents] [--quality-steps 6]``, on an otherwise
idle machine.

**Update and generation, shared against today's.** Each example (the calculator, and the
OpenAI Agents SDK calculator, whose agent sends the SDK's own instructions and tool schema)
is trained ``--steps`` steps at each group size, from the same seed, three ways (the
calculator graded with partial credit, so that its steps update):

- ``today``: ``[learner] share_prefix = false``, ``[engine] prefix_cache = false``, fp32
  generation (what the trainer did before);
- ``shared``: both on, fp32 generation;
- ``shared+bf16``: both on, ``[engine] precision = "bf16"`` (left out, here and in the
  trained comparison below, on a CPU without native bf16, where that precision is refused).

Generation seconds per step are the runs' own (``generation_sec``; the rollouts differ a
little between runs, so over the steps and repeats). The update is compared on the very same
sequences: in one more ``shared`` run every step's sequences are first trained on copies of
the model and optimiser, unshared then shared, ``--repeats`` times (``_update_ab.py``). Peak
memory is each of the other runs' (``peak_rss_gb``, the trainer's peak resident memory).

**bf16 against fp32 generation, trained.** The calculator trained ``--quality-steps`` steps
with each, the held-out rows evaluated at the start and at the end: completion tokens/s, the
engine's mismatch KL, and the held-out pass rate and reward after the same steps.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis_ai.gateway.policies.torch_device import cpu_has_native_bf16

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: The calculator graded with partial credit (``async_task/slow_tools.py``'s `CloseAnswer`, its
#: waits ~1 ms), so that nearly every group's rewards differ and every step updates: a step of
#: all-equal rewards applies no update, and there would be nothing to time.
CLOSE_ANSWER = HERE / "async_task" / "slow_tools.py"
CLOSE_ANSWER_ENV = {"env.BENCH_TOOL_MEDIAN_SEC": '"0.001"', "env.BENCH_TOOL_SIGMA": '"0.1"'}
EXAMPLES = {
    "calculator": (ROOT / "examples" / "calculator", "configs/training/calculator.toml"),
    "openai_agents": (
        ROOT / "examples" / "openai_agents_calculator",
        "configs/training/openai_agents_calculator.toml",
    ),
}
WAYS = {
    "today": {"learner.share_prefix": "false", "engine.prefix_cache": "false",
              "engine.precision": '"fp32"'},
    "shared": {"learner.share_prefix": "true", "engine.prefix_cache": "true",
               "engine.precision": '"fp32"'},
    "shared+bf16": {"learner.share_prefix": "true", "engine.prefix_cache": "true",
                    "engine.precision": '"bf16"'},
}  # fmt: skip
#: The precisions the torch engine may generate in here: bf16 is refused on a CPU that would
#: emulate it (no AVX512-BF16 or AMX).
PRECISIONS = ("fp32", "bf16") if cpu_has_native_bf16() else ("fp32",)
CHILD = HERE / "_update_ab.py"
#: A run's steps may take this long at most.
RUN_TIMEOUT_SEC = 3600


@dataclass
class Run:
    """One training run's figures."""

    steps: list[dict[str, Any]]
    updates: list[dict[str, Any]] = field(default_factory=list)
    """The update timed unshared and shared on the same sequences (``shared`` runs)."""
    evals: list[dict[str, Any]] = field(default_factory=list)

    @property
    def generation_sec(self) -> float:
        return statistics.fmean(s["generation_sec"] for s in self.steps)

    @property
    def peak_rss_gb(self) -> float:
        return max(s.get("peak_rss_gb") or 0.0 for s in self.steps)


def _step_mean(run: Run, key: str) -> float:
    """The mean of a step figure over the run's steps (0 where a step has none)."""
    return statistics.fmean(s.get(key) or 0.0 for s in run.steps)


def _without_eval(config: Path) -> None:
    """Drop the config's ``[eval]`` table: the comparison times the steps alone."""
    text = config.read_text()
    config.write_text(re.sub(r"(?ms)^\[eval\]\n.*?(?=^\[|\Z)", "", text))


def train(
    example: str, settings: dict[str, str], workdir: Path, *, timed_update: int = 0,
    keep_eval: bool = False,
) -> Run:  # fmt: skip
    """``osmosis train run`` of a copy of ``example`` with ``settings`` as ``--set`` flags;
    with ``timed_update`` repeats, through ``_update_ab.py``."""
    import shutil

    source, config = EXAMPLES[example]
    workspace = Path(tempfile.mkdtemp(prefix=f"{example}-", dir=workdir))
    shutil.copytree(
        source, workspace, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".osmosis")
    )
    if not keep_eval:
        _without_eval(workspace / config)
    if example == "calculator":
        shutil.copy(CLOSE_ANSWER, workspace / "rollouts" / "calculator" / CLOSE_ANSWER.name)
        text = (workspace / config).read_text()
        (workspace / config).write_text(text.replace('"main.py"', f'"{CLOSE_ANSWER.name}"'))
        settings = {**CLOSE_ANSWER_ENV, **settings}
    flags = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    updates = workspace / "updates.jsonl"
    env = {
        **os.environ,
        "PREFIX_BENCH_OUT": str(updates),
        "PREFIX_BENCH_REPEATS": str(timed_update),
    }
    command = (
        [sys.executable, str(CHILD)]
        if timed_update
        else [str(Path(sys.executable).with_name("osmosis"))]
    )
    process = subprocess.run(
        [*command, "train", "run", config, "--name", "bench", *flags],
        cwd=workspace, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_SEC,
    )  # fmt: skip
    if process.returncode:
        raise SystemExit(
            f"{example} {settings}: exited {process.returncode}\n{process.stdout[-3000:]}"
        )
    run_dir = workspace / ".osmosis" / "train" / "bench"
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    timed = (
        [json.loads(line) for line in updates.read_text().splitlines()] if updates.exists() else []
    )
    return Run(steps, timed, [e for e in events if e.get("event") == "eval"])


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def compare(args: argparse.Namespace, workdir: Path) -> None:
    print(f"# shared prompts: {args.steps} steps a run, {args.repeats} repeats\n")
    header = (
        f"{'example':<14} {'G':>2}  {'update s/step unshared → shared (×)':<38} "
        f"{'tokens computed/trained':<24} {'generation s/step today → shared, shared+bf16':<48} "
        f"{'peak RSS GB today / shared / +bf16':<34}"
    )
    print(header)
    for example in args.examples:
        for group in args.groups:
            base = {"training.steps": str(args.steps), "training.group_size": str(group),
                    "training.max_minutes": "120", "checkpoints.every": "1000"}  # fmt: skip
            ways = {w: s for w, s in WAYS.items() if w != "shared+bf16" or "bf16" in PRECISIONS}
            runs: dict[str, list[Run]] = {way: [] for way in ways}
            for _ in range(args.repeats):
                for way, settings in ways.items():
                    runs[way].append(train(example, {**base, **settings}, workdir))
            # Its own run: the copies it trains would count in the others' peak memory.
            timed = train(example, {**base, **WAYS["shared"]}, workdir, timed_update=args.repeats)
            pairs = [p for u in timed.updates for p in u["pairs"]]
            unshared = _median([p["unshared_sec"] for p in pairs])
            shared = _median([p["shared_sec"] for p in pairs])
            computed = sum(p["shared_computed"] for p in pairs)
            tokens = sum(p["tokens"] for p in pairs)
            generation = {way: _median([r.generation_sec for r in rs]) for way, rs in runs.items()}
            peak = {way: max(r.peak_rss_gb for r in rs) for way, rs in runs.items()}
            today = generation["today"]
            update = f"{unshared:6.2f} → {shared:6.2f} ({shared / unshared:4.2f}×)"
            share = f"{computed / max(tokens, 1):5.2f} ({computed}/{tokens})"
            bf16 = generation.get("shared+bf16")
            generated = (
                f"{today:6.1f} → {generation['shared']:6.1f} "
                f"({generation['shared'] / today:4.2f}×), "
                + (f"{bf16:6.1f} ({bf16 / today:4.2f}×)" if bf16 else "- (no native bf16)")
            )
            memory = " / ".join(f"{peak[way]:.2f}" for way in ways)
            print(
                f"{example:<14} {group:>2}  {update:<38} {share:<24} {generated:<48} {memory}",
                flush=True,
            )
            for way, rs in runs.items():
                per_repeat = [round(r.generation_sec, 1) for r in rs]
                updates = [round(_step_mean(r, "update_sec"), 1) for r in rs]
                peaks = [round(r.peak_rss_gb, 2) for r in rs]
                # The rollouts differ between runs: their tokens and the engine's busy time
                # tell the engine's speed apart from what the policy chose to write.
                tokens = [round(_step_mean(r, "tokens_generated")) for r in rs]
                busy = [round(_step_mean(r, "policy_busy_sec"), 1) for r in rs]
                print(
                    f"    {way}: generation s/step {per_repeat}, update s/step {updates}, "
                    f"peak RSS GB {peaks}, tokens generated/step {tokens}, engine busy "
                    f"s/step {busy}"
                )


def quality(args: argparse.Namespace, workdir: Path) -> None:
    print(f"\n# bf16 against fp32 generation: the calculator, {args.quality_steps} steps\n")
    print(f"{'engine':<6} {'tok/s':>7} {'mismatch KL':>12} {'held-out pass before → after':>30} "
          f"{'reward before → after':>24} {'steps s':>8}")  # fmt: skip
    for precision in PRECISIONS:
        settings = {"training.steps": str(args.quality_steps), "engine.precision": f'"{precision}"',
                    "eval.every": "1000", "checkpoints.every": "1000"}  # fmt: skip
        started = time.perf_counter()
        run = train("calculator", settings, workdir, keep_eval=True)
        elapsed = time.perf_counter() - started
        rates = [s["tokens_per_sec"] for s in run.steps if s.get("tokens_per_sec")]
        kl = [s["engine_mismatch_kl"] for s in run.steps if s.get("engine_mismatch_kl") is not None]
        first, last = run.evals[0], run.evals[-1]
        mismatch = statistics.fmean(kl) if kl else float("nan")
        print(
            f"{precision:<6} {_median(rates):7.1f} {mismatch:12.5f} "
            f"{first['pass_rate']:14.3f} → {last['pass_rate']:.3f} "
            f"{first['mean_reward']:15.3f} → {last['mean_reward']:.3f} {elapsed:8.0f}",
            flush=True,
        )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--groups", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--examples", nargs="+", default=list(EXAMPLES), choices=list(EXAMPLES))
    parser.add_argument("--quality-steps", type=int, default=6, help="0: skip the bf16 runs")
    parser.add_argument("--skip-compare", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-prefix-") as directory:
        if not args.skip_compare:
            compare(args, Path(directory))
        if args.quality_steps:
            quality(args, Path(directory))


if __name__ == "__main__":
    main()
