"""`osmosis train run` end to end: a real CLI subprocess, rollout server and tiny model."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import math
import os
import pty
import re
import resource
import signal
from pathlib import Path

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.eval.run_dir import run_lock
from osmosis_ai.train.config import load_train_config
from osmosis_ai.train.loop.runner import (
    TrainingStopped,
    TrainOptions,
    run_training,
)
from tests.train.training_project import OSMOSIS, kill_once_written
from tests.train.training_project import lines as _lines
from tests.train.training_project import run as _run
from tests.train.training_project import start as _start
from tests.train.training_project import text as _text
from tests.train.training_project import train_here as _train_here
from tests.train.training_project import workspace as _workspace
from tests.train.training_project import write_rows as _write_rows

pytestmark = [pytest.mark.slow, pytest.mark.whole_run]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


async def _run_on_a_terminal(config: Path, *args: str, limit_sec: float = 120) -> tuple[int, str]:
    """As `_run`, with a pseudo-terminal as the command's stdout and stderr."""
    leader, follower = pty.openpty()
    process = await asyncio.create_subprocess_exec(
        OSMOSIS, "train", "run", str(config), *args,
        cwd=config.parents[2], stdout=follower, stderr=follower,
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "160"},
    )  # fmt: skip
    os.close(follower)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the command closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    try:
        async with asyncio.timeout(limit_sec):
            await asyncio.gather(asyncio.to_thread(read), process.wait())
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        os.close(leader)
    assert process.returncode is not None
    # Without the terminal's colour and cursor codes, so the text reads as on screen.
    return process.returncode, _ANSI.sub("", b"".join(chunks).decode(errors="replace"))


async def test_train_run_writes_metrics_evals_a_checkpoint_and_no_secret(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "tiny-secret-value-0123456789"
    monkeypatch.setenv("TINY_SECRET", secret)  # the child inherits it
    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 5\n[checkpoints]\nevery = 2")
    config.write_text(config.read_text() + '[secrets]\nrequired = ["TINY_SECRET"]\n')
    # Key and secret in every output; drawn rewards, so that both steps apply an update.
    _write_rows(tmp_path / "ws", metadata={"leak": True, "random_reward": True})
    code, out = await _run(config, "--set", "training.steps=2")
    assert code == 0, out
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    assert "debug " in (run_dir / "logs.txt").read_text(), "the rollout's output is logged"
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "notes.txt" for p in files), "the rollout's artifacts are kept"
    for path in files:
        assert secret.encode() not in path.read_bytes(), path
    assert secret not in out
    metrics = _lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for line in metrics:
        assert isinstance(line["loss"], float) and math.isfinite(line["loss"]), line
        assert line["tokens_generated"] > 0 and line["tokens_trained"] > 0
        # The policy's own generating time is part of the rollout phase, not all of it.
        assert 0 < line["policy_busy_sec"] <= line["generation_sec"], line
    events = _lines(run_dir / "events.jsonl")
    # The journal keeps the settings the run used: the file's, with the --set override.
    (start,) = [e for e in events if e["event"] == "start"]
    assert start["overrides"] == ["training.steps=2"] and start["steps"] == 2
    settings = start["settings"]
    assert settings["training"]["steps"] == 2 and settings["checkpoints"]["every"] == 2
    # The resolved config: recipe, file and flags, as TOML the run's directory keeps.
    resolved = (run_dir / "config.toml").read_text()
    assert "# --set training.steps=2" in resolved and "\nsteps = 2\n" in resolved
    assert [e["step"] for e in events if e["event"] == "eval"] == [0, 2]
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [2]
    checkpoint = run_dir / "checkpoints" / "step-0002"
    assert (checkpoint / "config.json").is_file() and (checkpoint / "trainer.pt").is_file()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step-0002"]
    assert (run_dir / "checkpoints" / "latest").resolve() == checkpoint.resolve()
    assert any((run_dir / "rollouts").rglob("*.json")), "the rollouts' files stay in the run"
    assert "step 1: reward" in out and "step 2: reward" in out
    assert "before" in out and "after" in out
    # transformers' own bars and warnings stay out of the run's output (not a terminal here).
    for noise in ("Loading weights", "Writing model shards", "it/s", "%|", "training steps"):
        assert noise not in out, noise


@pytest.mark.parametrize(
    "metadata",
    [{}, {"tools": True}, {"sampling": {"top_p": 0.9, "top_k": 20}}],
    ids=["free-text", "under-a-grammar", "top-p-and-top-k"],
)
async def test_the_learner_scores_tokens_as_the_engine_sampled_them(
    tmp_path: Path, tiny_model_dir: Path, metadata: dict[str, object]
) -> None:
    """At the start of a step the learner's logprobs are the engine's (the ratio is 1): at a
    sampling temperature other than 1, for replies generated under a tool grammar, whose
    masks the learner replays, and for a workflow that sets its own top_p and top_k, whose
    cut the learner applies too."""
    config = _workspace(
        tmp_path / "ws",
        tiny_model_dir,
        'steps = 1\n[sampling]\ntemperature = 0.3\n[learner]\nprecision = "fp32"',
    )
    if metadata:
        _write_rows(config.parents[2], metadata=metadata)
    code, out = await _run(config)
    assert code == 0, out
    [line] = _lines(tmp_path / "ws" / ".osmosis" / "train" / "tiny" / "metrics.jsonl")
    assert line["tokens_trained"] > 0, line
    assert line["engine_mismatch_kl"] < 1e-6 and abs(line["mean_ratio"] - 1) < 1e-4, line
    assert line["importance_ratio_max"] < 1 + 1e-3, line
    assert (line["constrained_fraction"] == 1.0) is ("tools" in metadata), line


async def test_resume_after_sigkill_applies_no_step_twice(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 3\n[checkpoints]\nevery = 1")
    events = tmp_path / "ws" / ".osmosis" / "train" / "tiny" / "events.jsonl"
    process = await _start(config)
    try:
        async with asyncio.timeout(120):
            while '"event": "checkpoint"' not in _text(events):  # noqa: ASYNC110 -- another process writes it
                await asyncio.sleep(0.1)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        await process.wait()
    killed_at = [e for e in _lines(events) if e["event"] == "checkpoint"]
    assert killed_at and killed_at[-1]["step"] < 3
    code, out = await _run(config)
    assert code == 0, out
    assert f"resuming after step {killed_at[-1]['step']}" in out
    metrics = _lines(events.with_name("metrics.jsonl"))
    assert [m["step"] for m in metrics] == [1, 2, 3]
    checkpoints = [e["step"] for e in _lines(events) if e["event"] == "checkpoint"]
    assert checkpoints == sorted(set(checkpoints)) and checkpoints[-1] == 3


async def test_rollout_server_dying_mid_step_leaves_the_step_unapplied(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 2\n[checkpoints]\nevery = 1")
    # 2 held-out + 6 step-1 rollouts come first: the 10th is inside step 2.
    _write_rows(tmp_path / "ws", metadata={"die_at": 10, "counter": str(tmp_path / "count")})
    code, out = await _run(config)
    assert code == 1, out
    assert "step 2 was not applied, the last checkpoint is step 1" in out
    # The held-out results so far are shown before the error (only the start's evaluation).
    assert "held-out results" in out and "│ before" in out and "│ after" not in out
    assert out.index("held-out results") < out.index("error:")
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    assert [m["step"] for m in _lines(run_dir / "metrics.jsonl")] == [1]
    _write_rows(tmp_path / "ws")  # the server survives now: the same command resumes
    code, out = await _run(config)
    assert code == 0, out
    assert "resuming after step 1" in out
    assert [m["step"] for m in _lines(run_dir / "metrics.jsonl")] == [1, 2]


async def test_a_held_out_evaluation_whose_rollouts_all_failed_stops_the_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 1")
    _write_rows(tmp_path / "ws", metadata={"raise": True})
    with pytest.raises(TrainingStopped) as stopped:
        await _train_here(config)
    assert str(stopped.value) == (
        "held-out evaluation after step 0: 2 of 2 rollouts failed (agent_error 2); first: "
        "workflow raised RuntimeError: the tool crashed; run the same command to resume"
    )
    assert stopped.value.outcome is not None and not stopped.value.outcome.evals
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    journal = _lines(run_dir / "events.jsonl")
    assert [(e["event"], e["step"]) for e in journal if e["event"] in {"stopped", "eval"}] == [
        ("stopped", 0)
    ]
    _write_rows(tmp_path / "ws")  # the workflow is fixed: the same command runs
    outcome = await _train_here(config)
    assert [point.step for point in outcome.evals] == [0, 1]


async def test_non_finite_step_stops_the_run_and_keeps_the_checkpoint(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    # A learning rate this large makes the weights infinite after step 1: step 2's loss is not.
    training = "steps = 3\n[checkpoints]\nevery = 1\n[learner]\nlearning_rate = 1e30"
    config = _workspace(tmp_path / "ws", tiny_model_dir, training)
    code, out = await _run(config)
    assert code == 1, out
    assert "step 2 was not applied, the last checkpoint is step 1" in out
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    assert (run_dir / "checkpoints" / "step-0001" / "trainer.pt").is_file()
    stopped = [e for e in _lines(run_dir / "events.jsonl") if e["event"] == "stopped"]
    assert [e["step"] for e in stopped] == [2]


def test_unknown_training_key_is_named_with_its_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "stepz = 3")
    lines = config.read_text().splitlines()
    with pytest.raises(ConfigError) as error:
        load_train_config(config)
    assert f"line {lines.index('stepz = 3') + 1}" in str(error.value)
    assert "training.stepz" in str(error.value)


def test_bad_training_values_name_the_key(tmp_path: Path, tiny_model_dir: Path) -> None:
    for bad, key in (
        ("steps = 0", "training.steps"),
        ('[algorithm]\nnormalisation = "mean"', "algorithm.normalisation"),
        ("[algorithm]\nkl_beta = true", "algorithm.kl_beta"),
        ("[sampling]\ntemperature = -1", "sampling.temperature"),
        ('[algorithm.overlong]\nmode = "cut"', "algorithm.overlong.mode"),
    ):
        config = _workspace(tmp_path / key, tiny_model_dir, bad)
        with pytest.raises(ConfigError, match=key):
            load_train_config(config)


async def test_cli_reports_a_config_error_on_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "[extra]\nx = 1")
    code, out = await _run(config, limit_sec=60)
    assert code == 2
    line = config.read_text().splitlines().index("[extra]") + 1
    assert out.strip().count("\n") == 0 and f"line {line}: unknown section [extra]" in out


async def test_a_held_out_file_is_evaluated_as_is_and_every_dataset_row_trains(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 1\nprompts_per_step = 6")
    held = [{"user_prompt": f"held {i}", "ground_truth": str(i)} for i in range(3)]
    held_file = tmp_path / "ws" / "data" / "held.jsonl"
    held_file.write_text("".join(json.dumps(r) + "\n" for r in held))
    # The file splits off held-out rows ([eval] rows = 2); the flag replaces the split.
    flag = 'eval.dataset="data/held.jsonl"'
    run_dir = (await _train_here(config, (flag,))).run_dir
    lines = _lines(run_dir / "rollouts.jsonl")
    # The three held-out rows come after the six training rows, which all train in step 1.
    assert {line["row"] for line in lines if line["rollout_id"].startswith("eval-")} == {6, 7, 8}
    assert {line["row"] for line in lines if line["rollout_id"].startswith("step-")} == set(
        range(6)
    )
    (start,) = [e for e in _lines(run_dir / "events.jsonl") if e["event"] == "start"]
    assert start["eval_dataset"] == str(held_file)
    said = f"--set {flag} replaces the file's eval.rows = 2"
    assert said in (run_dir / "logs.txt").read_text()
    # The other way round, a flag's split replaces the file's held-out file.
    text = config.read_text().replace("rows = 2\n", 'dataset = "data/held.jsonl"\n')
    config.write_text(text)
    assert load_train_config(config).eval_dataset == held_file
    over = load_train_config(config, ["eval.rows=2"])
    assert over.eval_dataset is None and over.eval.split == 2
    assert over.notes == ("--set eval.rows=2 replaces the file's eval.dataset = 'data/held.jsonl'",)
    # Both in the file, or both in flags: the user must keep one.
    config.write_text(text.replace("[eval]\n", "[eval]\nrows = 2\n"))
    with pytest.raises(ConfigError, match=r"line \d+: eval.rows splits the dataset"):
        load_train_config(config)
    with pytest.raises(ConfigError, match=r"--set eval.rows=1: eval.rows splits"):
        load_train_config(config, ["eval.rows=1", 'eval.dataset="x.jsonl"'])
    config.write_text(text)
    with pytest.raises(ConfigError, match=r"eval.dataset 'held.txt' must be a local"):
        load_train_config(config, ['eval.dataset="held.txt"'])


async def run_without(
    module: str, tmp_path: Path, model_dir: Path, training: str, monkeypatch: pytest.MonkeyPatch
) -> str:
    """The output of a run whose child cannot import ``module`` (a package ahead of the real
    one on its path, whose import fails as a missing module's does), checked to have stopped
    on one line, exit 2, before it created anything."""
    blocked = tmp_path / "blocked" / module
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{module}'\", name='{module}')\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(blocked.parent))
    config = _workspace(tmp_path / "ws", model_dir, training)
    code, out = await _run(config, limit_sec=60)
    assert code == 2 and out.strip().count("\n") == 0, out
    assert not (tmp_path / "ws" / ".osmosis" / "train" / "tiny").exists(), "nothing started"
    return out


async def test_a_missing_llguidance_stops_the_run_before_anything_starts(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = await run_without("llguidance", tmp_path, tiny_model_dir, "steps = 1", monkeypatch)
    assert "missing 'llguidance'" in out and "pip install 'osmosis-ai[train]'" in out


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("training.stepz=3", "--set training.stepz=3: unknown key 'training.stepz'"),
        ("training.steps=0", "--set training.steps=0: training.steps must be"),
        ("algorithm.loss=ppo", "--set algorithm.loss=ppo: algorithm.loss must be one of"),
        ("algorithm.recipe=grpo2", "--set algorithm.recipe=grpo2: algorithm.recipe must be one of"),
        ("steps=3", "--set steps=3: write --set section.key=value"),
    ],
)
async def test_a_bad_override_is_named_by_its_flag_on_one_line(
    tmp_path: Path, tiny_model_dir: Path, override: str, expected: str
) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "")
    code, out = await _run(config, "--set", override, limit_sec=60)
    assert code == 2 and out.strip().count("\n") == 0, out
    assert expected in out


def test_overrides_are_checked_like_the_file(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 4")
    loaded = load_train_config(
        config, ["training.steps=7", "learner.learning_rate=1e-5", 'learner.precision="fp32"']
    )
    assert loaded.training.steps == 7 and loaded.learner.learning_rate == 1e-5
    assert loaded.learner.precision == "fp32"
    assert loaded.overrides == (
        "training.steps=7", "learner.learning_rate=1e-5", 'learner.precision="fp32"'
    )  # fmt: skip
    # A value that is not TOML is a string: the same check as a string in the file.
    assert load_train_config(config, ["learner.precision=fp32"]).learner.precision == "fp32"
    # A table the file lacks is created, a subsection too; one the file has cannot be
    # replaced by a value.
    vllm = load_train_config(config, ["engine.vllm.max_model_len=512"]).engine.vllm
    assert vllm is not None and vllm.max_model_len == 512
    lora = load_train_config(config, ["learner.lora.rank=4"]).learner.lora
    assert lora is not None and lora.rank == 4 and lora.scale_alpha == 8
    with pytest.raises(ConfigError, match="--set training=3: write --set section.key=value"):
        load_train_config(config, ["training=3"])
    with pytest.raises(ConfigError, match=r"--set engine.vllm.env=1: engine.vllm.env must be a"):
        load_train_config(config, ["engine.vllm.env=1"])


@pytest.mark.parametrize("resample", [0, 2])
async def test_dynamic_sampling_reruns_zero_gradient_groups_up_to_the_bound(
    tmp_path: Path, tiny_model_dir: Path, resample: int
) -> None:
    training = f"steps = 1\n[algorithm]\nresample_zero_gradient = {resample}"
    config = _workspace(tmp_path / "ws", tiny_model_dir, training)
    # Every group's rewards are equal: none carries a gradient.
    _write_rows(tmp_path / "ws", metadata={"reward": 0.5})
    run_dir = (await _train_here(config)).run_dir
    [metrics] = _lines(run_dir / "metrics.jsonl")
    # 2 rows per step, each run again `resample` times; still zero-gradient, nothing trained.
    assert metrics["resampled_groups"] == 2 * resample
    assert metrics["zero_gradient_groups"] == 2
    assert metrics["loss"] is None and metrics["tokens_trained"] == 0
    assert metrics["no_update"] == "every group's rewards were equal"
    rollouts = sorted(p.name for p in (run_dir / "rollouts").iterdir() if "resample" in p.name)
    assert len(rollouts) == 2 * resample * 3  # group_size = 3
    attempts = {name.rsplit("-row-", 1)[0] for name in rollouts}
    assert attempts == {f"step-0001-resample-{a}" for a in range(1, resample + 1)}
    assert _same_weights(tiny_model_dir, run_dir / "checkpoints" / "step-0001")


async def test_a_step_whose_every_rollout_overlong_masks_applies_no_update_and_says_why(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Every reply of the random tiny model runs to max_tokens (8), and overlong = "mask"
    leaves each one out: no token carries loss, so the step applies no update (the weights
    stay the base model's) and its metrics line and journal say why."""
    training = 'steps = 1\n[algorithm.overlong]\nmode = "mask"'
    config = _workspace(tmp_path / "ws", tiny_model_dir, training)
    _write_rows(tmp_path / "ws", metadata={"random_reward": True})
    run_dir = (await _train_here(config)).run_dir
    [metrics] = _lines(run_dir / "metrics.jsonl")
    assert metrics["zero_gradient_groups"] == 0 and metrics["updates"] == 0, metrics
    assert "overlong" in metrics["no_update"] and metrics["tokens_trained"] == 0
    [step] = [e for e in _lines(run_dir / "events.jsonl") if e["event"] == "step"]
    assert step["no_update"] == metrics["no_update"]
    assert _same_weights(tiny_model_dir, run_dir / "checkpoints" / "step-0001")


def _address_space(pid: int) -> int:
    """The bytes of virtual memory process ``pid`` has mapped (``VmSize``)."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(x for x in status if x.startswith("VmSize:")).split()[1]) * 1024


def _same_weights(first: Path, second: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


async def test_out_of_memory_in_the_update_stops_the_run_naming_the_token_budget(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    # Six 400-token completions in one micro-batch: the update's logprobs hold each
    # 1,024-position chunk's fp32 logits over the vocabulary and their exponentials (1024 x
    # 49152 x 4 bytes, ~200 MB each), in the forward pass and again in the backward one:
    # measured, the process maps ~720 MB more in the update than after the held-out
    # evaluation, and under 30 MB more while it generates (glibc holding at most two malloc
    # arenas: by default each new thread may reserve a 64 MB one, 135-360 MB measured while
    # generating, which could use up the margin before the update began).
    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 1")
    _write_rows(tmp_path / "ws", metadata={"random_reward": True})  # an update always follows
    text = config.read_text().replace("token_budget = 2048", "token_budget = 8192")
    config.write_text(text.replace("max_tokens = 8", "max_tokens = 400"))
    events = tmp_path / "ws" / ".osmosis" / "train" / "tiny" / "events.jsonl"
    process = await _start(config, env={"MALLOC_ARENA_MAX": "2"})
    async with asyncio.timeout(120):
        while '"event": "eval"' not in _text(events):  # noqa: ASYNC110 -- another process writes it
            await asyncio.sleep(0.02)
        # The model is loaded and has evaluated: leave it 300 MB more address space.
        hard = resource.prlimit(process.pid, resource.RLIMIT_AS)[1]
        limit = _address_space(process.pid) + (300 << 20)
        resource.prlimit(process.pid, resource.RLIMIT_AS, (limit, hard))
        out = (await process.communicate())[0].decode()
    assert process.returncode == 1, out
    errors = [x for x in out.splitlines() if "error:" in x]
    assert len(errors) == 1, out  # the whole output when it failed otherwise
    line = errors[0]
    assert "out of memory in the update of step 1" in line
    assert "lower [learner] token_budget (now 8192)" in line
    assert "step 1 was not applied, the last checkpoint is step 0" in line
    run_dir = events.parent
    assert not _text(run_dir / "metrics.jsonl")
    assert [e["step"] for e in _lines(events) if e["event"] == "stopped"] == [1]
    await _train_here(config)  # without the limit, the same run applies step 1
    assert [m["step"] for m in _lines(run_dir / "metrics.jsonl")] == [1]


async def test_a_sequence_over_the_token_budget_stops_the_run_naming_the_key(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 1")
    config.write_text(config.read_text().replace("token_budget = 2048", "token_budget = 8"))
    with pytest.raises(TrainingStopped) as stopped:
        await _train_here(config)
    assert "more than [learner] token_budget (8); raise token_budget" in str(stopped.value)
    assert "step 1 was not applied" in str(stopped.value)


async def test_resume_journals_each_step_once_after_a_kill_between_checkpoints(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 3\n[checkpoints]\nevery = 2")
    events = tmp_path / "ws" / ".osmosis" / "train" / "tiny" / "events.jsonl"
    await kill_once_written(config, events, '"event": "step"')
    killed = _lines(events)
    assert [e["step"] for e in killed if e["event"] == "step"] == [1]
    assert not [e for e in killed if e["event"] == "checkpoint"], "killed before checkpoint 2"
    await _train_here(config)
    journal = _lines(events)
    assert [e["step"] for e in journal if e["event"] == "step"] == [1, 2, 3]
    assert [e["step"] for e in journal if e["event"] == "eval"] == [0, 3]
    assert [m["step"] for m in _lines(events.with_name("metrics.jsonl"))] == [1, 2, 3]


async def test_resume_saves_over_a_checkpoint_written_but_not_journaled(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 1")
    events = (await _train_here(config)).run_dir / "events.jsonl"
    # As a kill right after checkpoints/step-0001 was renamed into place, before its line.
    journal = _lines(events)
    cut = next(i for i, e in enumerate(journal) if e["event"] == "checkpoint")
    events.write_text("".join(json.dumps(e) + "\n" for e in journal[:cut]))
    assert (events.parent / "checkpoints" / "step-0001" / "trainer.pt").is_file()
    assert (await _train_here(config)).steps_done == 1
    journal = _lines(events)
    assert [e["step"] for e in journal if e["event"] == "checkpoint"] == [1]
    assert [e["step"] for e in journal if e["event"] == "step"] == [1]


async def test_kl_is_against_the_initial_policy_and_fresh_starts_over(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    training = "steps = 2\n[checkpoints]\nevery = 1\n[algorithm]\nkl_beta = 0.1"
    config = _workspace(tmp_path / "ws", tiny_model_dir, training)
    run_dir = (await _train_here(config)).run_dir
    first, second = _lines(run_dir / "metrics.jsonl")
    # Step 1's policy is the reference itself; after one update they differ, so the
    # reference did not follow the update.
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)
    assert math.isfinite(second["kl"]) and second["kl"] > 1e-7
    # Resumed from checkpoint 2, the reference is still the initial model, not the checkpoint
    # (against which step 3's first forward pass would give 0).
    config.write_text(config.read_text().replace("steps = 2", "steps = 3"))
    await _train_here(config)
    assert {"event": "resume", "step": 2} in _lines(run_dir / "events.jsonl")
    third = _lines(run_dir / "metrics.jsonl")[-1]
    assert third["step"] == 3 and math.isfinite(third["kl"]) and third["kl"] > 1e-7
    # --fresh deletes the run and starts at step 1; on a terminal, with a progress bar.
    (run_dir / "marker").write_text("from the old run")
    config.write_text(config.read_text().replace("steps = 3", "steps = 1"))
    code, out = await _run_on_a_terminal(config, "--fresh")
    assert code == 0, out
    assert "resuming" not in out and not (run_dir / "marker").exists()
    assert "training steps" in out and "0/1" in out, "the bar shows on a terminal"
    assert "step 1: reward" in out and "Loading weights" not in out
    assert [m["step"] for m in _lines(run_dir / "metrics.jsonl")] == [1]
    assert [e["event"] for e in _lines(run_dir / "events.jsonl")][:3] == ["start", "eval", "step"]


async def test_a_second_train_run_of_the_same_run_is_refused(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 1")
    with run_lock(tmp_path / "ws" / ".osmosis" / "train", "tiny"):
        code, out = await _run(config, limit_sec=60)
    assert code == 2, out
    assert "another `osmosis train run` already holds run 'tiny'" in out


async def test_library_run_keeps_transformers_quiet_and_restores_its_settings(
    tmp_path: Path, tiny_model_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:

    # Untyped functions: reached through the module object rather than imported names.
    hf_logging = importlib.import_module("transformers.utils.logging")

    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 1")
    hf_logging.set_verbosity_warning()
    hf_logging.enable_progress_bar()
    capfd.readouterr()  # whatever the fixtures printed
    outcome = await run_training(TrainOptions(config_path=config))
    assert outcome.steps_done == 1 and [point.step for point in outcome.evals] == [0, 1]
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "Writing model shards" not in err, err
    # Only while the runner loads and saves: the caller's settings are back.
    assert hf_logging.is_progress_bar_enabled()
    assert hf_logging.get_verbosity() == logging.WARNING


def test_step_line_says_how_many_groups_were_resampled() -> None:
    from osmosis_ai.cli.train import _step_line

    metrics = {"step": 3, "reward_mean": 0.5, "zero_gradient_groups": 1, "resampled_groups": 0}
    assert "zero-gradient groups 1, time" in _step_line(metrics)
    line = _step_line({**metrics, "resampled_groups": 4})
    assert "zero-gradient groups 1 (after 4 resampled), time" in line
    assert "no update" not in line
    idle = _step_line({**metrics, "no_update": "every group's rewards were equal"})
    assert idle.endswith("s update; no update: every group's rewards were equal")
    left_out = _step_line({**metrics, "excluded": {"no_calls": 3, "failed": 1}})
    assert "zero-gradient groups 1, left out 4 (failed 1, no_calls 3), time" in left_out


def test_step_line_says_the_tokens_the_update_computed_of_those_it_trained_on() -> None:
    from osmosis_ai.cli.train import _step_line

    metrics = {"step": 2, "zero_gradient_groups": 0, "update_sec": 3.0}
    line = _step_line({**metrics, "tokens_forwarded": 12_480, "tokens_computed": 4_210})
    assert line.endswith("s update, tokens computed 4,210 of 12,480")
    assert "tokens computed" not in _step_line({**metrics, "tokens_forwarded": 0})


def test_a_missing_training_config_is_named_as_one(tmp_path: Path) -> None:
    missing = tmp_path / "configs" / "training" / "nope.toml"
    with pytest.raises(ConfigError, match=f"training config {missing} does not exist"):
        load_train_config(missing)
