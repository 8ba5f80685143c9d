"""``osmosis train`` side by side with TRL's ``GRPOTrainer``, matched settings (issue 31).

Run with ``make bench-trl`` (``STEPS=40 SEED=0``), or ``python benchmarks/trl_compare.py
[--steps N] [--seed S] [--only osmosis|trl] [--workdir DIR]``, on an otherwise idle machine
(40 steps: about half an hour on 2 cores; ``--steps 2``: under 3 minutes).

TRL is installed once into its own Python 3.11 environment (``benchmarks/.cache/trl-<version>``,
git-ignored) from ``scripts/trl-bench-requirements.txt``: pinned, with torch's CPU build (a
CUDA torch is refused). ``osmosis train`` runs from this interpreter's environment. Both
train the embedded model (SmolLM2-135M-Instruct converted to a HuggingFace directory) on the
task in ``benchmarks/trl_task`` (arithmetic answered with the bare number, one model call,
one reward function: ``rollouts/arith/arith_reward.py``) for the same steps, one after the
other, each in its own process tree, and see the same rows at the same steps (TRL gets them
in osmosis's order, unshuffled). Then one evaluation (``_trl_side.py eval``, greedy, in the
TRL environment) scores the initial model and both final checkpoints on the held-out rows.

Printed for both: seconds per step split into generation and update, tokens/s of each
phase, the peak RSS of the process tree (sampled every 0.2 s), the held-out mean reward and
pass rate, and osmosis/TRL ratios; the matched settings and the differences that could not
be matched come first.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis_ai.gateway.policies.torch_device import cpu_has_native_bf16
from osmosis_ai.train.config import TrainConfig, load_train_config

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TASK = HERE / "trl_task"
CONFIG = Path("configs") / "training" / "arith.toml"
SIDE_SCRIPT = HERE / "_trl_side.py"
OSMOSIS = str(Path(sys.executable).with_name("osmosis"))
TRL_VERSION = "1.16.0"
TRL_VENV = HERE / ".cache" / f"trl-{TRL_VERSION}"
REQUIREMENTS = ROOT / "scripts" / "trl-bench-requirements.txt"
#: The interpreter the TRL environment is made with: the pinned torch is a cp311 wheel.
TRL_BASE_PYTHON = "python3.11"
RUN_NAME = "bench"
SAMPLE_SEC = 0.2
#: Width of the settings block's lines.
WIDTH = 100
#: A trainer's process may take this long per step (model load, evaluations and saving
#: included in the allowance) before it is stopped.
SEC_PER_STEP_LIMIT = 180.0
SEC_FIXED_LIMIT = 900.0
EVAL_LIMIT_SEC = 900.0


def _config() -> TrainConfig:
    """The osmosis side's config, as it resolves (defaults included)."""
    return load_train_config(TASK / CONFIG)


def _token_budget() -> int:
    """The update's micro-batch size osmosis trains with."""
    return _config().learner.token_budget


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


# -- the TRL environment ---------------------------------------------------------------------


def trl_python() -> Path:
    """The TRL environment's interpreter, made and installed on first use (and again when
    the requirements file changes)."""
    python = TRL_VENV / "bin" / "python"
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    marker = TRL_VENV / f".installed-{digest}"
    if marker.exists():
        return python
    base = shutil.which(TRL_BASE_PYTHON)
    if base is None:
        raise SystemExit(
            f"{TRL_BASE_PYTHON} is not on PATH: the TRL environment needs it (its pinned torch "
            "is a CPU wheel for Python 3.11)"
        )
    shutil.rmtree(TRL_VENV, ignore_errors=True)
    print(f"installing TRL {TRL_VERSION} into {TRL_VENV} (once) ...", flush=True)
    subprocess.run([base, "-m", "venv", str(TRL_VENV)], check=True)
    log = TRL_VENV / "install.log"
    with log.open("w") as output:
        installed = subprocess.run(
            [str(python), "-m", "pip", "install", "--no-input", "-r", str(REQUIREMENTS)],
            stdout=output, stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
    if installed.returncode != 0:
        raise SystemExit(f"installing the TRL environment failed; see {log}")
    _refuse_cuda(python)
    marker.touch()
    return python


def _refuse_cuda(python: Path) -> None:
    """Stop when the environment got a CUDA torch or NVIDIA runtime wheels (multi-GB)."""
    frozen = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    packages = {p["name"].lower(): p["version"] for p in json.loads(frozen.stdout)}
    nvidia = sorted(name for name in packages if name.startswith("nvidia-"))
    torch = packages.get("torch", "")
    if nvidia or not torch.endswith("+cpu"):
        raise SystemExit(
            f"the TRL environment got torch {torch or '(none)'} and {nvidia or 'no'} NVIDIA "
            f"wheels; it must have torch's CPU build only: pin it in {REQUIREMENTS}"
        )


def _versions(python: str) -> dict[str, str]:
    code = (
        "import json, platform; from importlib.metadata import version\n"
        "names = ('torch', 'transformers', 'accelerate', 'trl')\n"
        "found = {}\n"
        "for name in names:\n"
        "    try:\n"
        "        found[name] = version(name)\n"
        "    except Exception:\n"
        "        pass\n"
        "found['python'] = platform.python_version()\n"
        "print(json.dumps(found))"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    versions: dict[str, str] = json.loads(done.stdout)
    return versions


# -- measuring a process tree ----------------------------------------------------------------


def _children(parent_of: dict[int, int], root: int) -> set[int]:
    tree = {root}
    grew = True
    while grew:
        grew = False
        for pid, parent in parent_of.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


def tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and all its descendants now, summed (Linux ``/proc``)."""
    parent_of: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        parent_of[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in _children(parent_of, root):
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


@dataclass
class Finished:
    """A measured process: its exit code, wall time and peak summed RSS."""

    returncode: int
    wall_sec: float
    peak_rss_bytes: int


def run_measured(argv: list[str], *, cwd: Path, log: Path, limit_sec: float) -> Finished:
    """Run ``argv`` to its end (its output to ``log``), sampling its tree's RSS."""
    peak = 0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "_OSMOSIS_"))}
    started = time.perf_counter()
    with log.open("w") as output:
        process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, tree_rss_bytes(process.pid))
                stop.wait(SAMPLE_SEC)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            process.wait(timeout=limit_sec)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
            print(f"  stopped after {limit_sec:.0f} s: {' '.join(argv[:3])} ...", flush=True)
        finally:
            stop.set()
            sampler.join()
    return Finished(process.returncode, time.perf_counter() - started, peak)


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# -- one trainer's figures -------------------------------------------------------------------


@dataclass
class Side:
    """One trainer's measurements."""

    name: str
    steps: list[dict[str, float]] = field(default_factory=list)
    """Per step: generation_sec, update_sec, total_sec, generated/forwarded tokens, reward."""
    peak_rss_bytes: int = 0
    wall_sec: float = 0.0
    evaluation: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def measured(self) -> list[dict[str, float]]:
        """The steps the averages use: all but the first (it warms up kernels and the
        allocator) when there are more."""
        return self.steps[1:] if len(self.steps) > 1 else self.steps

    def mean(self, key: str) -> float:
        return statistics.fmean(step[key] for step in self.measured())

    def rate(self, tokens: str, seconds: str) -> float:
        spent = sum(step[seconds] for step in self.measured())
        return sum(step[tokens] for step in self.measured()) / spent if spent > 0 else 0.0

    def reward_window(self, first: bool, width: int = 5) -> float:
        window = self.steps[:width] if first else self.steps[-width:]
        return statistics.fmean(step["reward_mean"] for step in window)


def run_osmosis(workdir: Path, steps: int, seed: int) -> tuple[Side, Path]:
    """``osmosis train run`` on a copy of the task workspace; returns its figures and the
    final checkpoint exported as a HuggingFace directory."""
    workspace = workdir / "osmosis-workspace"
    shutil.copytree(TASK, workspace, ignore=shutil.ignore_patterns(".osmosis", "__pycache__"))
    sets = [f"training.steps={steps}", f"training.seed={seed}", f"checkpoints.every={steps}"]
    argv = [OSMOSIS, "train", "run", str(CONFIG), "--name", RUN_NAME, "--fresh"]
    for value in sets:
        argv += ["--set", value]
    log = workdir / "osmosis-train.log"
    print(f"osmosis: training {steps} steps (log: {log}) ...", flush=True)
    limit = SEC_FIXED_LIMIT + SEC_PER_STEP_LIMIT * steps
    finished = run_measured(argv, cwd=workspace, log=log, limit_sec=limit)
    if finished.returncode != 0:
        raise SystemExit(f"osmosis train failed (exit {finished.returncode}):\n{_tail(log)}")
    run_dir = workspace / ".osmosis" / "train" / RUN_NAME
    side = Side("osmosis")
    side.peak_rss_bytes, side.wall_sec = finished.peak_rss_bytes, finished.wall_sec
    skipped = 0
    for line in _read_jsonl(run_dir / "metrics.jsonl"):
        skipped += line["loss"] is None
        side.steps.append(
            {
                "generation_sec": line["generation_sec"],
                "update_sec": line["update_sec"],
                # Building the sequences from the call records sits between the two phases.
                "total_sec": line["generation_sec"] + line["sequences_sec"] + line["update_sec"],
                "generated_tokens": line["tokens_generated"],
                "forwarded_tokens": line["tokens_forwarded"],
                "reward_mean": line["reward_mean"] or 0.0,
            }
        )
    evals = [e for e in _read_jsonl(run_dir / "events.jsonl") if e["event"] == "eval"]
    if evals:
        side.notes.append(
            "osmosis's own held-out evaluation (its gateway, same rows, greedy): mean reward "
            f"{evals[0]['mean_reward']:.3f} -> {evals[-1]['mean_reward']:.3f}, pass rate "
            f"{evals[0]['pass_rate']:.3f} -> {evals[-1]['pass_rate']:.3f}"
        )
    if skipped:
        side.notes.append(f"osmosis applied no update in {skipped} step(s): all groups all-equal")
    exported = workdir / "osmosis-model"
    subprocess.run(
        [OSMOSIS, "train", "export", str(run_dir), "--merged", str(exported)],
        cwd=workspace, check=True, capture_output=True,
    )  # fmt: skip
    return side, exported


def trl_rows(steps: int, seed: int, per_step: int) -> list[dict[str, Any]]:
    """The training rows in the order osmosis picks them, step after step."""
    from osmosis_ai.train.loop.runner import step_rows

    rows = _read_jsonl(TASK / "data" / "train.jsonl")
    ordered = []
    for step in range(1, steps + 1):
        ordered += [rows[i] for i in step_rows(range(len(rows)), per_step, seed, step)]
    return ordered


def run_trl(
    python: Path, model_dir: Path, workdir: Path, settings: dict[str, Any]
) -> tuple[Side, Path]:
    """``GRPOTrainer`` (``_trl_side.py train``) with ``settings``; returns its figures and
    its final model directory."""
    rows = workdir / "trl-rows.jsonl"
    _write_jsonl(rows, trl_rows(settings["steps"], settings["seed"], settings["prompts_per_step"]))
    settings_file = workdir / "trl-settings.json"
    settings_file.write_text(json.dumps(settings, indent=2))
    out = workdir / "trl-model"
    timings, facts = workdir / "trl-steps.jsonl", workdir / "trl-facts.json"
    argv = [str(python), str(SIDE_SCRIPT), "train", "--model", str(model_dir)]
    argv += ["--rows", str(rows), "--settings", str(settings_file)]
    argv += ["--out", str(out), "--timings", str(timings), "--facts", str(facts)]
    log = workdir / "trl-train.log"
    print(f"TRL: training {settings['steps']} steps (log: {log}) ...", flush=True)
    limit = SEC_FIXED_LIMIT + SEC_PER_STEP_LIMIT * settings["steps"]
    finished = run_measured(argv, cwd=workdir, log=log, limit_sec=limit)
    if finished.returncode != 0:
        raise SystemExit(f"TRL's GRPOTrainer failed (exit {finished.returncode}):\n{_tail(log)}")
    side = Side("TRL")
    side.peak_rss_bytes, side.wall_sec = finished.peak_rss_bytes, finished.wall_sec
    side.steps = _read_jsonl(timings)
    found = json.loads(facts.read_text())

    def phase(name: str) -> str:
        seen = found["autocast"][name]
        return {(True,): "yes", (False,): "no", (): "not seen"}.get(tuple(seen), "mixed")

    rates = ", ".join(f"{step['learning_rate']:.3g}" for step in side.steps[:6])
    side.notes.append(
        f"TRL, as its run showed: bf16 autocast in generation {phase('generation')}, in the "
        f"update {phase('update')}; activation checkpointing "
        f"{'on' if found['activation_checkpointing'] else 'off'}; {found['optimizer']}, "
        f"loss_type {found['loss_type']!r}; learning rate of steps 1-6: {rates}"
    )
    return side, out


def evaluate(python: Path, model_dir: Path, workdir: Path, label: str) -> dict[str, Any]:
    """The shared held-out evaluation of ``model_dir`` (greedy, in the TRL environment)."""
    argv = [str(python), str(SIDE_SCRIPT), "eval", "--model", str(model_dir)]
    argv += ["--rows", str(TASK / "data" / "heldout.jsonl")]
    argv += ["--max-tokens", str(_config().sampling.max_tokens)]
    log = workdir / f"eval-{label}.log"
    with log.open("w") as errors:
        done = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=errors, text=True, timeout=EVAL_LIMIT_SEC
        )
    if done.returncode != 0:
        raise SystemExit(f"the evaluation of {label} failed:\n{_tail(log)}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- settings --------------------------------------------------------------------------------


def trl_settings(steps: int, seed: int) -> dict[str, Any]:
    """What ``_trl_side.py train`` configures ``GRPOConfig`` from: the osmosis config's
    values (the one place they are written), the steps and the seed."""
    config = _config()
    clip_low, clip_high = config.algorithm.clip
    return {
        "steps": steps,
        "seed": seed,
        "prompts_per_step": config.training.prompts_per_step,
        "group_size": config.training.group_size,
        "learning_rate": config.learner.learning_rate,
        "warmup_steps": max(1, steps // 10),
        "max_tokens": config.sampling.max_tokens,
        "temperature": config.sampling.temperature,
        "clip_low": clip_low,
        "clip_high": clip_high,
        "kl_beta": config.algorithm.kl_beta,
        "max_grad_norm": 1.0,
        # What osmosis's precision "auto" picks on this CPU: bf16 autocast only where the CPU
        # computes bf16 natively (emulated, an update takes minutes instead of seconds).
        "bf16": cpu_has_native_bf16(),
    }


def _check_config(config: TrainConfig) -> None:
    """The settings block below names these values: refuse a config that drifted from it."""
    expected = {
        "[algorithm] normalisation": (config.algorithm.normalisation, "token"),
        "[algorithm] advantage_scale": (config.algorithm.scale, "std"),
        "[algorithm] resample_zero_gradient": (config.algorithm.resample_zero_gradient, 0),
        "[learner] precision": (config.learner.precision, "auto"),
        "[eval] every": (config.eval.every, 0),
    }
    for key, (value, wanted) in expected.items():
        if value != wanted:
            raise SystemExit(f"{TASK / CONFIG}: {key} must be {wanted!r} to match TRL")


def print_settings(
    settings: dict[str, Any], model_dir: Path, versions: dict[str, dict[str, str]]
) -> None:
    s = settings
    matched = [
        ("model", f"SmolLM2-135M-Instruct, the embedded model as a HF directory ({model_dir})"),
        ("task", "benchmarks/trl_task: arithmetic, bare-number answer, one call, no tool"),
        (
            "reward",
            "trl_task/rollouts/arith/arith_reward.py's score() on both: 0.5 when the last number "
            "is right, 0.5 when the reply is the number alone (less for a longer reply)",
        ),
        ("rows", "the same 4 training rows at each step (TRL: osmosis's order, unshuffled)"),
        (
            "per step",
            f"{s['prompts_per_step']} prompts x {s['group_size']} completions, "
            "one optimiser step (TRL: batch 32, accumulation 1, num_iterations 1)",
        ),
        ("steps, seed", f"{s['steps']}, {s['seed']}"),
        (
            "learning rate",
            f"{s['learning_rate']:g}, AdamW (fused, no weight decay), linear "
            f"warm-up over {s['warmup_steps']} steps ((k+1)/{s['warmup_steps']}), "
            "then constant (TRL: the same optimiser and schedule, passed in)",
        ),
        (
            "completion",
            f"at most {s['max_tokens']} tokens, temperature {s['temperature']:g}, no top-k / top-p",
        ),
        (
            "loss",
            f"token-level normalisation (DAPO; TRL loss_type 'dapo'), clip "
            f"{s['clip_low']:g} / {s['clip_high']:g} (TRL epsilon / epsilon_high)",
        ),
        ("advantages", "(r - group mean) / (group sample std + 1e-4) (TRL scale_rewards 'group')"),
        ("KL", f"off (kl_beta = beta = {s['kl_beta']:g})"),
        (
            "precision",
            "fp32 weights, update under bf16 autocast (osmosis precision 'auto' on a CPU with "
            "native bf16; TRL bf16=True, use_cpu=True)"
            if s["bf16"]
            else "fp32 weights and update: this CPU has no native bf16 (osmosis precision "
            "'auto'; TRL bf16=False, use_cpu=True)",
        ),
        ("grad clip", f"global norm {s['max_grad_norm']:g}"),
        (
            "evaluation",
            "one function for every checkpoint: 40 held-out rows, chat template, "
            f"greedy, {s['max_tokens']} tokens, score(); pass = reward 1",
        ),
    ]
    unmatched = [
        "generation: osmosis serves the policy through its gateway to one rollout per "
        "completion (HTTP, the rollout server in a child process), batching concurrent calls, "
        "in fp32; TRL calls model.generate on the 32 left-padded prompts at once, under the "
        "autocast accelerate puts on the model's forward (bf16 where the update uses it)",
        "the clip: TRL with one gradient step per batch takes the ratio against its own "
        "detached logprobs (exactly 1, the clip never binds); osmosis against the behaviour "
        "logprobs the engine recorded in fp32, so a bf16 update sees ratios near 1",
        "all-equal groups: osmosis leaves them out of the update and out of the token "
        "normalisation (and applies no update when every group is); TRL trains on their "
        "zero-advantage tokens, which count in its normalisation",
        f"micro-batches: osmosis packs the update into {_token_budget():,}-token micro-batches; "
        "TRL forwards the 32 completions as one padded batch",
        "the update's head: osmosis projects only the completion positions onto the vocabulary; "
        "TRL's fused LM head does so on CUDA but, in its torch tiles on the CPU, projects every "
        "position, prompt included (both: log-softmax in fp32, logits / T)",
        "sampling is random on both and not seeded alike: the same rows, other completions",
        "held-out evaluations inside the runs: osmosis evaluates its held-out rows at the start "
        "and the end (in its wall time, not in the step times); TRL none",
        "step time: osmosis's generation includes grading and the HTTP path, its update "
        "handing freed memory back (malloc_trim), and its total adds building the sequences; "
        "TRL's generation is _generate_and_score_completions "
        "(tokenising, generating, decoding, rewards, advantages) and its update the rest of "
        "the step (forward, backward, clipping, optimiser, scheduler)",
    ]
    print("osmosis train vs TRL GRPOTrainer: matched settings")
    width = max(len(name) for name, _ in matched)
    for name, value in matched:
        print(textwrap.fill(value, WIDTH, initial_indent=f"  {name:<{width}}  ",
                            subsequent_indent=" " * (width + 4)))  # fmt: skip
    print("not matched")
    for line in unmatched:
        print(textwrap.fill(line, WIDTH, initial_indent="  - ", subsequent_indent="    "))
    print("environments")
    for name, found in versions.items():
        listed = ", ".join(f"{k} {v}" for k, v in found.items())
        print(f"  {name:<8} {listed}")
    cpu = "bf16 natively (AVX512-BF16 or AMX)" if s["bf16"] else "no native bf16"
    print(f"  machine  {os.cpu_count()} cores, {platform.machine()}, {cpu}\n", flush=True)


# -- the table -------------------------------------------------------------------------------


def _ratio(mine: float, theirs: float) -> str:
    return f"{mine / theirs:.2f}" if mine and theirs else ""


def print_table(sides: list[Side], baseline: dict[str, Any]) -> None:
    dropped = "the first step left out" if len(sides[0].steps) > 1 else "one step"
    print(f"\nresults (means over the steps, {dropped}; RSS of the whole process tree)")
    rows: list[tuple[str, list[float], int]] = [
        ("s/step: generation", [s.mean("generation_sec") for s in sides], 2),
        ("s/step: update", [s.mean("update_sec") for s in sides], 2),
        ("s/step: total", [s.mean("total_sec") for s in sides], 2),
        ("tokens/s: generation (completion tokens)",
         [s.rate("generated_tokens", "generation_sec") for s in sides], 1),
        ("tokens/s: update (prompt + completion tokens)",
         [s.rate("forwarded_tokens", "update_sec") for s in sides], 1),
        ("completion tokens per step", [s.mean("generated_tokens") for s in sides], 1),
        ("peak RSS (GB)", [s.peak_rss_bytes / 1e9 for s in sides], 2),
        ("whole run, wall (s)", [s.wall_sec for s in sides], 0),
        ("training reward, first 5 steps", [s.reward_window(True) for s in sides], 3),
        ("training reward, last 5 steps", [s.reward_window(False) for s in sides], 3),
    ]  # fmt: skip
    for key, label in (("mean_reward", "mean reward"), ("pass_rate", "pass rate")):
        values = [(s.evaluation or {}).get(key, float("nan")) for s in sides]
        rows.append((f"held-out {label} (initial model {baseline[key]:.3f})", values, 3))
    names = [s.name for s in sides]
    width = max(len(name) for name, _, _ in rows)
    header = "".join(f"{name:>12}" for name in names)
    ratio_header = f"{'osmosis/TRL':>14}" if len(sides) == 2 else ""
    print(f"  {'':<{width}}{header}{ratio_header}")
    for name, values, digits in rows:
        cells = "".join(f"{value:>12,.{digits}f}" for value in values)
        ratio = f"{_ratio(values[0], values[1]):>14}" if len(values) == 2 else ""
        print(f"  {name:<{width}}{cells}{ratio}")
    if len(sides) == 2:
        print("  (osmosis/TRL: below 1 favours osmosis for seconds and RSS, above 1 for tokens/s "
              "and rewards)")  # fmt: skip
    notes = [note for side in sides for note in side.notes]
    replies = [(s.name, (s.evaluation or {}).get("examples", [])) for s in sides]
    for name, examples in [("initial model", baseline.get("examples", [])), *replies]:
        if examples:
            notes.append(f"{name}, a held-out reply: {examples[0]}")
    for note in notes:
        print(textwrap.fill(note, WIDTH, initial_indent="  ", subsequent_indent="    "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=("osmosis", "trl"), help="run one trainer (debugging)")
    parser.add_argument("--workdir", type=Path, help="keep the runs here (default: a temp dir)")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.workdir is not None and args.workdir.exists() and any(args.workdir.iterdir()):
        parser.error(f"--workdir {args.workdir} is not empty")
    _check_config(_config())
    python = trl_python()
    from osmosis_ai.train.model import resolve_model

    model_dir = resolve_model("embedded")
    settings = trl_settings(args.steps, args.seed)
    versions = {"osmosis": _versions(sys.executable), "TRL": _versions(str(python))}
    mine = {k: v for k, v in versions["osmosis"].items() if k in ("torch", "transformers")}
    print_settings(settings, model_dir, versions)
    if any(versions["TRL"].get(k) != v for k, v in mine.items()):
        print("warning: torch or transformers differ between the two environments\n")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="osmosis-bench-trl-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        sides: list[tuple[Side, Path]] = []
        if args.only in (None, "osmosis"):
            sides.append(run_osmosis(workdir, args.steps, args.seed))
        if args.only in (None, "trl"):
            sides.append(run_trl(python, model_dir, workdir, settings))
        print("evaluating the initial model and the checkpoints on the held-out rows ...")
        baseline = evaluate(python, model_dir, workdir, "initial")
        for side, checkpoint in sides:
            side.evaluation = evaluate(python, checkpoint, workdir, side.name)
        print_table([side for side, _ in sides], baseline)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
