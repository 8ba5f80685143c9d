"""The learner: the model being trained on its device (full or LoRA), its optimiser and
schedule, and its checkpoints.

A full fine-tune trains every weight of the model; under LoRA (``lora_rank > 0``, built
with peft) only the adapter's matrices train, the base model's weights stay frozen, and
the KL reference is the same model with its adapter disabled (no second copy). The torch
engine generates with `Learner.served_model`, the very object the update changes, on the
learner's own thread (`Learner.thread`): every torch op on that model runs on one thread.

A checkpoint directory holds the weights (``save_pretrained``) or, under LoRA, the adapter
(``adapter_config.json`` naming the base model directory, adapter weights), the tokenizer,
and ``trainer.pt`` (optimiser, schedule, RNG states, step).
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.policies._hf_dir import (
    import_peft,
    is_adapter_dir,
    load_model_dir,
    quiet_peft,
    quiet_transformers,
    read_adapter_config,
)
from osmosis_ai.gateway.policies._torch_device import update_in_bf16
from osmosis_ai.gateway.policies.engines.grammar import GrammarCompiler
from osmosis_ai.train.config import TrainConfig, TrainingConfig, grpo_config

__all__ = ["Learner", "checkpoint_steps", "lora_config"]

_FEATURE = "osmosis train"
T = TypeVar("T")


@dataclass
class Learner:
    """The model being trained, its optimizer and schedule (torch: imported when built)."""

    model: Any
    """What the update trains: the transformers model, or its peft wrapper under LoRA."""
    tokenizer: Any
    optimizer: Any
    scheduler: Any
    reference: Any
    """The KL reference: the initial model (full), the peft model itself (its logprobs are
    taken with the adapter disabled), or ``None`` without KL."""
    grpo: Any
    device: Any
    grammars: GrammarCompiler
    """Replays the grammars of constrained completions for the update (``train_step``)."""
    thread: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="osmosis-torch")
    )
    """The one thread the update and the torch engine's generation run on: torch keeps an
    OpenMP thread team and glibc a memory arena per calling thread, and two of each on a
    small machine stall each other and hold memory the other cannot reuse."""

    async def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``function(*args, **kwargs)`` on the learner's thread."""
        call = functools.partial(function, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self.thread, call)

    def close(self) -> None:
        """Let the thread go, once nothing runs on it any more."""
        self.thread.shutdown(wait=True)

    @property
    def served_model(self) -> Any:
        """The transformers model the engine generates with: under LoRA the base model, whose
        wrapped layers carry the live adapter."""
        return self.model.get_base_model() if self.lora else self.model

    @property
    def lora(self) -> bool:
        """Whether an adapter is trained rather than the whole model."""
        return hasattr(self.model, "peft_config")

    @classmethod
    async def load(cls, config: TrainConfig, source: Path, base_dir: Path, device: Any) -> Learner:
        """`build` on a new thread that the learner then owns, so that the weights are
        allocated where every later torch op on them runs."""
        thread = ThreadPoolExecutor(1, thread_name_prefix="osmosis-torch")
        build = functools.partial(cls.build, config, source, base_dir, device, thread=thread)
        try:
            return await asyncio.get_running_loop().run_in_executor(thread, build)
        except BaseException:
            thread.shutdown(wait=False)
            raise

    @classmethod
    def build(
        cls,
        config: TrainConfig,
        source: Path,
        base_dir: Path,
        device: Any,
        *,
        thread: ThreadPoolExecutor | None = None,
    ) -> Learner:
        """Load ``source`` (the base model or a checkpoint of this run) onto ``device`` for
        training (blocking); ``thread`` becomes `Learner.thread` (default: a new one)."""
        from osmosis_ai.train.algorithm.logprobs import check_head
        from osmosis_ai.train.algorithm.schedule import adamw, warmup_schedule

        training = config.training
        if source != base_dir:
            _check_resumable(source, training)
        with quiet_transformers():
            if training.lora_rank:
                model, tokenizer = _lora_model(config, source, base_dir, device)
                reference = model if training.kl_beta > 0 else None
            else:
                model, tokenizer = load_model_dir(source, feature=_FEATURE, device=device)
                # The KL term compares with the initial policy, so it loads the base model again.
                reference = None
                if training.kl_beta > 0:
                    reference = load_model_dir(base_dir, feature=_FEATURE, device=device)[0]
                    reference.requires_grad_(False)
        check_head(model)
        optimizer = adamw(model, lr=training.learning_rate)
        scheduler = warmup_schedule(
            optimizer, warmup_steps=max(1, training.steps // 10), total_steps=training.steps
        )
        grpo = grpo_config(
            training, bf16=update_in_bf16(device, training.precision, key="training.precision")
        )
        base = model.get_base_model() if training.lora_rank else model
        grammars = GrammarCompiler.of_model(base, tokenizer)
        parts = (model, tokenizer, optimizer, scheduler, reference, grpo, device, grammars)
        return cls(*parts) if thread is None else cls(*parts, thread=thread)

    def save(self, directory: Path, step: int) -> None:
        """Write a checkpoint into ``directory`` whole: a temp dir renamed into place."""
        import torch

        temp = directory.with_name(f".{directory.name}.tmp")
        shutil.rmtree(temp, ignore_errors=True)
        with quiet_transformers(), quiet_peft():
            self.model.save_pretrained(str(temp))
            self.tokenizer.save_pretrained(str(temp))
        state = {
            "step": step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
        }
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        torch.save(state, temp / "trainer.pt")
        # A kill after the rename but before the journal line leaves this step's directory
        # unjournaled: the resumed run saves the step again over it.
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(temp, directory)

    def restore(self, directory: Path) -> None:
        """The optimizer, schedule and RNG states of a checkpoint (weights load with it)."""
        import torch

        # On the CPU first: the optimiser moves its state to its parameters' device.
        state = torch.load(directory / "trainer.pt", map_location="cpu", weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)


def checkpoint_steps(checkpoints: Path) -> dict[int, Path]:
    """The ``step-NNNN`` checkpoint directories in ``checkpoints``, by step, oldest first."""
    found = {
        int(path.name.removeprefix("step-")): path
        for path in checkpoints.glob("step-[0-9]*")
        if path.name.removeprefix("step-").isdigit()
    }
    return dict(sorted(found.items()))


def _check_resumable(checkpoint: Path, training: TrainingConfig) -> None:
    """Refuse to resume a checkpoint of another kind (full or LoRA) or adapter shape than
    the config says, which would otherwise train something else than either.

    Raises:
        ConfigError: The checkpoint and the config disagree; the message names the setting.
    """
    stated = read_adapter_config(checkpoint) if is_adapter_dir(checkpoint) else {}
    rank = int(stated.get("r") or 0)
    if rank != training.lora_rank:
        kind = f"a LoRA checkpoint of rank {rank}" if rank else "a full fine-tuning checkpoint"
        raise ConfigError(
            f"{checkpoint} is {kind}, but training.lora_rank is {training.lora_rank}; set "
            f"lora_rank back to {rank} to resume the run, or start over with --fresh"
        )
    if not rank:
        return
    saved: dict[str, Any] = {
        "lora_alpha": stated.get("lora_alpha"),
        "lora_dropout": stated.get("lora_dropout"),
    }
    wanted: dict[str, Any] = {
        "lora_alpha": training.lora_scale_alpha,
        "lora_dropout": training.lora_dropout,
    }
    # peft saves "all-linear" as the layer names it found, so only a list compares.
    if not isinstance(training.lora_target_modules, str):
        saved["lora_target_modules"] = sorted(stated.get("target_modules") or [])
        wanted["lora_target_modules"] = sorted(training.lora_target_modules)
    for key, value in wanted.items():
        if saved[key] != value:
            raise ConfigError(
                f"{checkpoint} was trained with training.{key} = {saved[key]!r}, but the config "
                f"says {value!r}; set it back to resume the run, or start over with --fresh"
            )


def lora_config(training: TrainingConfig) -> Any:
    """The peft `LoraConfig` of ``training``'s LoRA settings.

    Raises:
        MissingExtraError: peft is not installed.
    """
    peft = import_peft(_FEATURE)
    target = training.lora_target_modules
    return peft.LoraConfig(
        r=training.lora_rank,
        lora_alpha=training.lora_scale_alpha,
        lora_dropout=training.lora_dropout,
        target_modules=target if isinstance(target, str) else list(target),
        bias="none",
        task_type="CAUSAL_LM",
    )


def _lora_model(config: TrainConfig, source: Path, base_dir: Path, device: Any) -> tuple[Any, Any]:
    """The base model with a trainable adapter: a new one, or the one checkpointed in
    ``source``; and the tokenizer."""
    training = config.training
    peft = import_peft(_FEATURE)
    base, tokenizer = load_model_dir(base_dir, feature=_FEATURE, device=device)
    with quiet_peft():
        if is_adapter_dir(source):
            model = peft.PeftModel.from_pretrained(base, str(source), is_trainable=True)
        else:
            model = peft.get_peft_model(base, lora_config(training))
    # Checkpoints name the base directory, so `torch:<checkpoint>` finds it again.
    model.peft_config["default"].base_model_name_or_path = str(base_dir)
    return model.eval(), tokenizer
