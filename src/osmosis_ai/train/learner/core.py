"""The learner: the model being trained on its device (full or LoRA), its optimiser and
schedule, and its checkpoints.

A full fine-tune trains every weight of the model; under LoRA (a ``[learner.lora]`` table, built
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
import ctypes
import ctypes.util
import functools
import os
import random
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.policies.engines.grammar import GrammarCompiler
from osmosis_ai.gateway.policies.hf_dir import (
    import_peft,
    is_adapter_dir,
    load_model_dir,
    quiet_peft,
    quiet_transformers,
    read_adapter_config,
)
from osmosis_ai.gateway.policies.spec import parse_policy_spec
from osmosis_ai.gateway.policies.torch_device import is_out_of_memory, update_in_bf16
from osmosis_ai.train.algorithm.sequences import TrainingSequence
from osmosis_ai.train.algorithm.settings import UpdateSettings
from osmosis_ai.train.config import LoraConfig, TrainConfig
from osmosis_ai.train.learner.teacher import ServerTeacher
from osmosis_ai.train.loop.outcome import TrainingStopped

if TYPE_CHECKING:
    from osmosis_ai.train.algorithm.update import StepMetrics

__all__ = ["Learner", "checkpoint_steps", "lora_config", "out_of_memory"]

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
    settings: UpdateSettings
    """What `train_step` takes: ``[algorithm]``, with the precision the device resolved."""
    device: Any
    grammars: GrammarCompiler
    """Replays the grammars of constrained completions for the update (``train_step``)."""
    thread: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="osmosis-torch")
    )
    teacher: Any = None
    """``[algorithm.distill]``'s teacher: a frozen model on the learner's device, a
    `ServerTeacher`, or ``None``."""
    """The one thread the update and the torch engine's generation run on: torch keeps an
    OpenMP thread team and glibc a memory arena per calling thread, and two of each on a
    small machine stall each other and hold memory the other cannot reuse."""

    async def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``function(*args, **kwargs)`` on the learner's thread."""
        call = functools.partial(function, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self.thread, call)

    async def update(
        self,
        sequences: list[TrainingSequence],
        advantages: list[float | tuple[float, ...]],
        step: int,
    ) -> StepMetrics:
        """Step ``step``'s update (`train_step`) on the learner's thread. Generation's freed
        buffers go back before it allocates, and its own after, so neither phase holds memory
        only the other could reuse.

        Raises:
            TrainingStopped: It ran out of memory (on any device); the message names
                ``[learner] token_budget``.
            NonFiniteStepError: Its loss or gradient is not finite; nothing was applied.
        """
        from osmosis_ai.train.algorithm.update import train_step

        try:
            await self.run(_return_freed_memory, self.device)
            return await self.run(
                train_step, self.model, self.optimizer, sequences, self.settings, step=step,
                reference_model=self.reference, scheduler=self.scheduler,
                grammars=self.grammars, advantages=advantages,
            )  # fmt: skip
        except (MemoryError, RuntimeError) as exc:
            stopped = out_of_memory(exc, step=step, token_budget=self.settings.token_budget)
            if stopped is None:
                raise
            raise stopped from None
        finally:
            self.model.train(False)
            await self.run(_return_freed_memory, self.device)

    async def teacher_logprobs(self, sequences: list[TrainingSequence]) -> list[tuple[float, ...]]:
        """The teacher's logprob of each token of ``sequences`` (on the learner's thread), as
        the learner scores its own: the sampling temperature, grammars and top-k/top-p cuts."""
        from osmosis_ai.train.algorithm.logprobs import sequence_logprobs

        assert self.teacher is not None, "the run distils from no teacher"
        if isinstance(self.teacher, ServerTeacher):
            return await self.teacher.logprobs(sequences)
        settings = self.settings
        return await self.run(
            sequence_logprobs, self.teacher, sequences, token_budget=settings.token_budget,
            device=self.device, grammars=self.grammars, bf16=settings.bf16,
            temperature=settings.temperature, share_prefix=settings.share_prefix,
        )  # fmt: skip

    def peak_memory(self) -> dict[str, float]:
        """The trainer's peak resident memory so far (Linux reports ``ru_maxrss`` in KiB)
        and, on CUDA, the peak GPU memory torch allocated on the learner's device."""
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
        peaks = {"peak_rss_gb": round(rss, 3)}
        if self.device.type == "cuda":
            import torch

            gpu = torch.cuda.max_memory_allocated(self.device) / 1024**3
            peaks["peak_gpu_memory_gb"] = round(gpu, 3)
        return peaks

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
            learner: Learner = await asyncio.get_running_loop().run_in_executor(thread, build)
            if isinstance(learner.teacher, ServerTeacher):
                await learner.teacher.check(learner.tokenizer)
            return learner
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
        from osmosis_ai.train.algorithm.attention import use_learner_attention
        from osmosis_ai.train.algorithm.logprobs import check_head, shares_prefixes
        from osmosis_ai.train.algorithm.schedule import adamw, warmup_schedule

        lora, kl_beta = config.learner.lora, config.algorithm.kl_beta
        if source != base_dir:
            _check_resumable(source, lora)
        with quiet_transformers():
            if lora is not None:
                model, tokenizer = _lora_model(lora, source, base_dir, device)
                reference = model if kl_beta > 0 else None
            else:
                model, tokenizer = load_model_dir(source, feature=_FEATURE, device=device)
                # The KL term compares with the initial policy, so it loads the base model again.
                reference = None
                if kl_beta > 0:
                    reference = load_model_dir(base_dir, feature=_FEATURE, device=device)[0]
                    reference.requires_grad_(False)
        check_head(model)
        steps = config.training.steps
        optimizer = adamw(model, lr=config.learner.learning_rate)
        scheduler = warmup_schedule(optimizer, warmup_steps=max(1, steps // 10), total_steps=steps)
        bf16 = update_in_bf16(device, config.learner.precision, key="learner.precision")
        settings = config.update_settings(bf16=bf16)
        if bf16 and device.type == "cpu":  # the reference too: its logprobs must round alike
            for scored in (model, reference):  # a LoRA reference is the model: set once
                if scored is not None:
                    use_learner_attention(scored)
        if settings.share_prefix and not shares_prefixes(model):
            settings = replace(settings, share_prefix=False)
        base = model.get_base_model() if lora is not None else model
        grammars = GrammarCompiler.of_model(base, tokenizer)
        distill = config.algorithm.distill
        teacher: Any = None
        if distill is not None and distill.teacher.startswith("openai:"):
            spec = parse_policy_spec(distill.teacher)
            assert spec.base_url is not None
            teacher = ServerTeacher(spec.base_url, spec.model)
        elif distill is not None:
            teacher = _teacher(Path(distill.teacher), base, tokenizer, device)
        parts = (model, tokenizer, optimizer, scheduler, reference, settings, device, grammars)
        if thread is None:
            return cls(*parts, teacher=teacher)
        return cls(*parts, thread=thread, teacher=teacher)

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


def _teacher(directory: Path, student: Any, tokenizer: Any, device: Any) -> Any:
    """The distillation teacher at ``directory`` on ``device``, frozen (blocking).

    Raises:
        ConfigError: Its directory lacks a file, or its tokenizer or vocabulary head is not the
            student's: the teacher scores the student's token ids, which must mean the same.
    """
    key = "algorithm.distill.teacher"
    try:
        teacher, teacher_tokenizer = load_model_dir(directory, feature=_FEATURE, device=device)
    except ConfigError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    if teacher_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ConfigError(
            f"{key} {str(directory)!r}: its tokenizer is not the student's (vocabularies of "
            f"{len(teacher_tokenizer)} and {len(tokenizer)} tokens, or ids that differ); the "
            "teacher scores the student's token ids, so use a teacher of the same family"
        )
    rows = teacher.get_output_embeddings().weight.shape[0]
    if rows != student.get_output_embeddings().weight.shape[0]:
        raise ConfigError(
            f"{key} {str(directory)!r}: its output head has {rows} rows, the student's "
            f"{student.get_output_embeddings().weight.shape[0]}; give a teacher whose "
            "vocabulary matches the student's"
        )
    teacher.requires_grad_(False)
    return teacher


def out_of_memory(exc: BaseException, *, step: int, token_budget: int) -> TrainingStopped | None:
    """The stop to raise when ``exc`` is an allocation failure of the update (on any
    device), else None."""
    if not is_out_of_memory(exc):
        return None
    return TrainingStopped(
        f"out of memory in the update of step {step}; lower [learner] token_budget "
        f"(now {token_budget}) so each micro-batch of the update holds fewer tokens"
    )


def _return_freed_memory(device: Any) -> None:
    """Hand the update's freed host buffers back to the system (glibc only; blocking).

    glibc keeps freed memory resident for reuse, and the update's and generation's freed
    buffers are interleaved so that neither reuses much of the other's: without this the
    trainer's peak RSS on the calculator rises from 6.9 to 10 GB over 12 steps. It costs the
    next step about 0.15 s per GB to fault the pages in again. An update on a GPU frees
    little host memory, so there is nothing to trim.
    """
    if device.type != "cpu":
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def checkpoint_steps(checkpoints: Path) -> dict[int, Path]:
    """The ``step-NNNN`` checkpoint directories in ``checkpoints``, by step, oldest first."""
    found = {
        int(path.name.removeprefix("step-")): path
        for path in checkpoints.glob("step-[0-9]*")
        if path.name.removeprefix("step-").isdigit()
    }
    return dict(sorted(found.items()))


def _check_resumable(checkpoint: Path, lora: LoraConfig | None) -> None:
    """Refuse to resume a checkpoint of another kind (full or LoRA) or adapter shape than
    the config says, which would otherwise train something else than either.

    Raises:
        ConfigError: The checkpoint and the config disagree; the message names the setting.
    """
    stated = read_adapter_config(checkpoint) if is_adapter_dir(checkpoint) else {}
    rank = int(stated.get("r") or 0)
    wanted_rank = lora.rank if lora is not None else 0
    if rank != wanted_rank:
        kind = f"a LoRA checkpoint of rank {rank}" if rank else "a full fine-tuning checkpoint"
        config = f"[learner.lora] rank is {wanted_rank}" if lora else "there is no [learner.lora]"
        fix = f"[learner.lora] rank = {rank}" if rank else "no [learner.lora] table"
        raise ConfigError(
            f"{checkpoint} is {kind}, but {config}; write {fix} to resume the run, or start "
            "over with --fresh"
        )
    if lora is None:
        return
    saved: dict[str, Any] = {
        "alpha": stated.get("lora_alpha"),
        "dropout": stated.get("lora_dropout"),
    }
    wanted: dict[str, Any] = {"alpha": lora.scale_alpha, "dropout": lora.dropout}
    # peft saves "all-linear" as the layer names it found, so only a list compares.
    if not isinstance(lora.target_modules, str):
        saved["target_modules"] = sorted(stated.get("target_modules") or [])
        wanted["target_modules"] = sorted(lora.target_modules)
    for key, value in wanted.items():
        if saved[key] != value:
            raise ConfigError(
                f"{checkpoint} was trained with [learner.lora] {key} = {saved[key]!r}, but the "
                f"config says {value!r}; set it back to resume the run, or start over with --fresh"
            )


def lora_config(lora: LoraConfig) -> Any:
    """The peft `LoraConfig` of ``[learner.lora]``.

    Raises:
        MissingExtraError: peft is not installed.
    """
    peft = import_peft(_FEATURE)
    target = lora.target_modules
    return peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.scale_alpha,
        lora_dropout=lora.dropout,
        target_modules=target if isinstance(target, str) else list(target),
        bias="none",
        task_type="CAUSAL_LM",
    )


def _lora_model(lora: LoraConfig, source: Path, base_dir: Path, device: Any) -> tuple[Any, Any]:
    """The base model with a trainable adapter: a new one, or the one checkpointed in
    ``source``; and the tokenizer."""
    peft = import_peft(_FEATURE)
    base, tokenizer = load_model_dir(base_dir, feature=_FEATURE, device=device)
    with quiet_peft():
        if is_adapter_dir(source):
            model = peft.PeftModel.from_pretrained(base, str(source), is_trainable=True)
        else:
            model = peft.get_peft_model(base, lora_config(lora))
    # Checkpoints name the base directory, so `torch:<checkpoint>` finds it again.
    model.peft_config["default"].base_model_name_or_path = str(base_dir)
    return model.eval(), tokenizer
