"""LoRA training (``[learner.lora]``): what trains, what stays, and a whole run's checkpoints,
resume, evaluation and merged export."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.policies.hf_dir import quiet_peft
from osmosis_ai.train import TrainingSequence
from osmosis_ai.train.algorithm.logprobs import policy_logprobs
from osmosis_ai.train.algorithm.micro_batches import collate
from osmosis_ai.train.algorithm.settings import AlgorithmConfig, UpdateSettings
from osmosis_ai.train.algorithm.update import train_step
from osmosis_ai.train.config import (
    LearnerConfig,
    LoraConfig,
    TrainConfig,
    TrainExperimentConfig,
    TrainingConfig,
    load_train_config,
)
from osmosis_ai.train.learner.core import Learner, lora_config
from osmosis_ai.train.learner.export import export_merged
from tests.subprocesses import communicate_within
from tests.train.conftest import on_policy
from tests.train.training_project import OSMOSIS
from tests.train.training_project import lines as _lines
from tests.train.training_project import run as _run
from tests.train.training_project import train_here as _train_here
from tests.train.training_project import workspace as _workspace

pytestmark = pytest.mark.slow  # left out of make test-fast

CPU = torch.device("cpu")


def _config(
    tmp_path: Path, model_dir: Path, *, rank: int, learning_rate: float, steps: int = 10,
    kl_beta: float = 0.0,
) -> TrainConfig:  # fmt: skip
    experiment = TrainExperimentConfig(
        rollout="tiny", entrypoint="main.py", model=str(model_dir), dataset=tmp_path / "r.jsonl"
    )
    return TrainConfig(
        path=tmp_path / "tiny.toml",
        workspace=tmp_path,
        experiment=experiment,
        training=TrainingConfig(steps=steps),
        algorithm=AlgorithmConfig(kl_beta=kl_beta),
        learner=LearnerConfig(learning_rate=learning_rate, lora=LoraConfig(rank=rank)),
    )


def _group(prompt: list[int], good: list[int], bad: list[int]) -> list[TrainingSequence]:
    """One group of two rollouts of ``prompt``: ``good`` rewarded, ``bad`` not (behaviour
    logprobs filled in by `on_policy`)."""
    return [
        TrainingSequence(
            rollout_id=name,
            group_id="g",
            reward=reward,
            token_ids=(*prompt, *completion),
            loss_mask=(0,) * len(prompt) + (1,) * len(completion),
            behaviour_logprobs=(0.0,) * (len(prompt) + len(completion)),
        )
        for name, reward, completion in (("good", 1.0, good), ("bad", 0.0, bad))
    ]


def _mean_logprob(model: Any, sequence: TrainingSequence) -> float:
    batch = collate([sequence], [0.0], [1.0])
    with torch.no_grad():
        logprobs = policy_logprobs(model, batch)
    return float(logprobs.sum() / batch.loss_mask.sum())


def test_lora_trains_the_adapter_and_leaves_the_base_weights_alone(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = _config(tmp_path, tiny_model_dir, rank=4, learning_rate=1e-2, steps=2)
    learner = Learner.build(config, tiny_model_dir, tiny_model_dir, CPU)
    assert learner.lora and learner.reference is None
    named = dict(learner.model.named_parameters())
    trainable = {name for name, p in named.items() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # Every linear layer of the attention and MLP blocks, and nothing else (not the head).
    wrapped = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable}
    assert wrapped == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    # The optimiser holds the adapter alone.
    held = {id(p) for group in learner.optimizer.param_groups for p in group["params"]}
    assert held == {id(named[name]) for name in trainable}
    before = {name: p.detach().clone() for name, p in named.items()}
    sequences = on_policy(learner.model, _group([1, 2, 3, 4], [5, 6, 7], [8, 9, 10]))
    train_step(learner.model, learner.optimizer, sequences, learner.settings, step=1)
    changed = {name for name, p in named.items() if not torch.equal(p, before[name])}
    # lora_B starts at zero, so lora_A gets no gradient in the first step; B moves.
    assert changed and changed <= trainable and any(".lora_B." in n for n in changed)
    # The engine serves the base model object, whose wrapped layers carry the adapter.
    served = learner.served_model
    assert served is learner.model.get_base_model()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad(), learner.model.disable_adapter():
        base_logits = served(ids).logits
    assert not torch.allclose(served(ids).logits, base_logits), "the served model has the adapter"


def test_lora_loss_falls_on_a_tiny_overfit_task(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = _config(tmp_path, tiny_model_dir, rank=8, learning_rate=5e-3, steps=20)
    learner = Learner.build(config, tiny_model_dir, tiny_model_dir, CPU)
    # The same group replayed, against the first policy's logprobs (PPO epochs on one batch),
    # with clipping wide enough not to stop the loss.
    grpo = UpdateSettings(AlgorithmConfig(clip_low=0.9, clip_high=50.0))
    sequences = on_policy(learner.model, _group([1, 2, 3], [11, 12, 13, 14], [21, 22, 23, 24]))
    good_before = _mean_logprob(learner.model, sequences[0])
    losses = [
        train_step(learner.model, learner.optimizer, sequences, grpo, step=step).loss
        for step in range(12)
    ]
    assert losses[0] == pytest.approx(0.0, abs=1e-6)  # ratio 1: advantages sum to 0
    assert losses[-1] < losses[0] - 0.5, losses
    assert all(b <= a + 1e-6 for a, b in zip(losses, losses[1:], strict=False)), losses
    assert _mean_logprob(learner.model, sequences[0]) > good_before + 0.5


def test_lora_kl_reference_is_the_base_model_with_the_adapter_off(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = _config(tmp_path, tiny_model_dir, rank=4, learning_rate=1e-2, kl_beta=0.5)
    learner = Learner.build(config, tiny_model_dir, tiny_model_dir, CPU)
    assert learner.reference is learner.model, "no second copy of the model is loaded"
    sequences = on_policy(learner.model, _group([1, 2, 3], [4, 5], [6, 7]))
    first = train_step(
        learner.model, learner.optimizer, sequences, learner.settings, step=1,
        reference_model=learner.reference,
    )  # fmt: skip
    second = train_step(
        learner.model, learner.optimizer, sequences, learner.settings, step=2,
        reference_model=learner.reference,
    )  # fmt: skip
    assert first.kl == pytest.approx(0.0, abs=1e-9)  # the adapter starts as the identity
    assert second.kl > 1e-9


def test_bad_lora_settings_are_refused_by_name(tmp_path: Path, tiny_model_dir: Path) -> None:
    lora = "[learner.lora]\n"
    for training, message in (
        (lora + "alpha = 16", r"learner.lora.rank is required in \[learner.lora\]"),
        (lora + "rank = 4\ndropout = 1.0", "learner.lora.dropout must be below 1"),
        (lora + 'rank = 4\ntarget_modules = "q_proj"', "learner.lora.target_modules must"),
        (lora + "rank = 4\ntarget_modules = []", "learner.lora.target_modules must"),
        (lora + "rank = 0", "learner.lora.rank must be positive"),
    ):
        config = _workspace(tmp_path / str(abs(hash(training))), tiny_model_dir, training)
        with pytest.raises(ConfigError, match=message):
            load_train_config(config)
    config = _workspace(
        tmp_path / "ok", tiny_model_dir, lora + 'rank = 4\ntarget_modules = ["q_proj"]'
    )
    loaded = load_train_config(config).learner.lora
    assert loaded is not None and loaded.target_modules == ("q_proj",)
    assert loaded.scale_alpha == 8.0  # twice the rank by default


def _eval_config(root: Path) -> Path:
    config = root / "configs" / "eval" / "tiny.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        '[experiment]\nrollout = "tiny"\nentrypoint = "main.py"\nmodel_path = "embedded"\n'
        'dataset = "data/rows.jsonl"\n[evaluation]\nn = 1\n'
    )
    return config


_PLAIN_LOAD = """
import json, sys
sys.modules["peft"] = None  # a machine without peft: importing it fails
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], local_files_only=True).eval()
ids = torch.tensor([json.loads(sys.argv[2])])
with torch.no_grad():
    print(json.dumps(model(ids).logits[0].tolist()))
"""


# Five CLI runs (train, resume, a refused rank, eval, export), ~60 s alone; a loaded CI worker
# beside the vLLM and framework-training modules took it past the default 120 s.
@pytest.mark.whole_run
@pytest.mark.timeout(360)
async def test_lora_run_checkpoints_resumes_evaluates_and_exports_a_merged_model(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    root = tmp_path / "ws"
    training = "steps = 2\n[checkpoints]\nevery = 1\nkeep = 2\n[learner.lora]\nrank = 4\n"
    config = _workspace(root, tiny_model_dir, training + "[algorithm]\nkl_beta = 0.1")
    run_dir = (await _train_here(config)).run_dir
    checkpoint = run_dir / "checkpoints" / "step-0002"
    files = {p.name for p in checkpoint.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "trainer.pt"} <= files
    assert "tokenizer.json" in files and "model.safetensors" not in files
    adapter = json.loads((checkpoint / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(tiny_model_dir) and adapter["r"] == 4
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "latest", "step-0001", "step-0002",
    ]  # fmt: skip
    first, second = _lines(run_dir / "metrics.jsonl")
    assert first["kl"] == pytest.approx(0.0, abs=1e-7) and second["kl"] > 1e-7

    # Resume: one more step from the adapter checkpoint.
    config.write_text(config.read_text().replace("steps = 2", "steps = 3"))
    code, out = await _run(config)
    assert code == 0, out
    assert "resuming after step 2" in out
    assert [m["step"] for m in _lines(run_dir / "metrics.jsonl")] == [1, 2, 3]
    latest = (run_dir / "checkpoints" / "latest").resolve()
    assert latest.name == "step-0003"
    # Extending the run with another rank than the checkpoint's is refused, not silently
    # trained (the finished run itself has nothing to do: it would load nothing).
    further = ("training.steps=4",)
    config.write_text(config.read_text().replace("rank = 4", "rank = 8"))
    with pytest.raises(ConfigError, match=r"is a LoRA checkpoint of rank 4, but \[learner.lora\]"):
        await _train_here(config, further)
    # So is another alpha (the default is twice the rank: 8).
    config.write_text(config.read_text().replace("rank = 8", "rank = 4\nalpha = 16"))
    with pytest.raises(ConfigError, match=r"trained with \[learner.lora\] alpha = 8(\.0)?, but"):
        await _train_here(config, further)

    # Evaluate the checkpoint: the base model with the adapter.
    process = await asyncio.create_subprocess_exec(
        OSMOSIS, "eval", "run", str(_eval_config(root)), "--model", f"torch:{latest}", "--strict",
        cwd=root, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out = (await communicate_within(process, 120))[0].decode()
    assert process.returncode == 0, out  # --strict: any failed rollout exits 3, saying why
    assert "Loading weights" not in out and "it/s]" not in out, out  # no library's bars
    (eval_dir,) = (root / ".osmosis" / "evals").glob("tiny-*")
    assert len(list((eval_dir / "trajectories").glob("*.json"))) == 6, out

    # Export it merged, and a step that is not kept is named.
    merged = tmp_path / "merged"
    code, out = await _osmosis(root, "train", "export", "tiny", "--merged", str(merged))
    assert code == 0, out
    assert "LoRA adapter merged into its base" in out
    assert not (merged / "adapter_config.json").exists() and (merged / "config.json").exists()
    code, out = await _osmosis(root, "train", "export", "tiny", "--step", "1", "--merged", "x")
    assert code == 2 and "has no checkpoint of step 1; it keeps step(s) 2, 3" in out, out
    code, out = await _osmosis(root, "train", "export", "tiny", "--merged", str(merged))
    assert code == 2 and "already exists and is not empty" in out, out

    # transformers alone (peft unimportable) loads it, with the adapter model's logits.
    ids = [1, 17, 300, 4000, 42, 7]
    plain = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _PLAIN_LOAD, str(merged), json.dumps(ids)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    merged_logits = torch.tensor(json.loads(plain.stdout))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), local_files_only=True)
    with torch.no_grad():
        base_logits = base(torch.tensor([ids])).logits[0]
    with quiet_peft():  # wraps base's layers in place
        with_adapter = PeftModel.from_pretrained(base, str(latest)).eval()
    with torch.no_grad():
        adapter_logits = with_adapter(torch.tensor([ids])).logits[0]
    delta = float((merged_logits - adapter_logits).abs().max())
    print(f"merged vs adapter model logits: max |delta| = {delta:.2e}")
    assert math.isfinite(delta) and delta <= 1e-4
    assert not torch.allclose(adapter_logits, base_logits), "the adapter was trained"


async def _osmosis(cwd: Path, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        OSMOSIS, *args, cwd=cwd,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    out = (await communicate_within(process, 120))[0].decode()
    assert process.returncode is not None
    return process.returncode, out


@pytest.mark.whole_run
async def test_a_full_checkpoint_is_exported_as_its_weights(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, "steps = 1")
    run_dir = (await _train_here(config)).run_dir
    out = tmp_path / "exported"
    code, text = await _osmosis(tmp_path, "train", "export", str(run_dir), "--merged", str(out))
    assert code == 0, text
    assert "full weights" in text
    checkpoint = run_dir / "checkpoints" / "step-0001"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in checkpoint.iterdir() if p.name != "trainer.pt"
    )
    assert (out / "model.safetensors").read_bytes() == (
        checkpoint / "model.safetensors"
    ).read_bytes()
    code, text = await _osmosis(tmp_path, "train", "export", "nope", "--merged", str(out / "x"))
    assert code == 2 and "no training run 'nope' with checkpoints" in text, text
    assert text.strip().count("\n") == 0, "one line"


def test_a_bf16_base_model_exports_merged_in_bf16(tmp_path: Path, tiny_model_dir: Path) -> None:
    from peft import get_peft_model
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_dir = tmp_path / "bf16-base"
    model: Any = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), local_files_only=True)
    model.to(torch.bfloat16).save_pretrained(str(base_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir), local_files_only=True)
    tokenizer.save_pretrained(str(base_dir))
    with quiet_peft():
        adapter = get_peft_model(model.float(), lora_config(LoraConfig(rank=4)))
    adapter.peft_config["default"].base_model_name_or_path = str(base_dir)
    checkpoint = tmp_path / "adapter"
    adapter.save_pretrained(str(checkpoint))
    tokenizer.save_pretrained(str(checkpoint))

    exported = export_merged(checkpoint, tmp_path / "merged")
    assert exported.merged_adapter
    with safe_open(str(exported.directory / "model.safetensors"), "pt") as weights:
        dtypes = {weights.get_slice(name).get_dtype() for name in weights.keys()}  # noqa: SIM118
    assert dtypes == {"BF16"}, "merged in fp32, saved in the base model's dtype"
