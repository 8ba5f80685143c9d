"""``osmosis train export``: a run's checkpoint as a plain HuggingFace model directory.

A LoRA checkpoint is merged into its base model; a full one is copied. Either way the
result holds ``config.json``, the weights and the tokenizer, and loads with transformers
(or vLLM) alone: no peft, no trainer state.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.policies.hf_dir import (
    adapter_base,
    check_model_dir,
    is_adapter_dir,
    load_model_dir,
    quiet_transformers,
)
from osmosis_ai.train.learner.core import checkpoint_steps
from osmosis_ai.train.run_files import RUN_FILES

__all__ = ["Exported", "export_merged", "find_checkpoint"]

_FEATURE = "osmosis train export"
#: Files of a checkpoint that are the trainer's, not the model's.
_TRAINER_FILES = frozenset({"trainer.pt"})


@dataclass(frozen=True)
class Exported:
    """What `export_merged` wrote."""

    directory: Path
    checkpoint: Path
    merged_adapter: bool
    """Whether a LoRA adapter was merged (else full weights were copied)."""


def find_checkpoint(run: str, step: int | None, *, workspace: Path) -> Path:
    """The checkpoint directory of ``run`` (a run directory, or a run name under
    ``<workspace>/.osmosis/train``): step ``step``, or the newest.

    Raises:
        ConfigError: There is no such run, or no such checkpoint (the message lists the
            steps the run keeps).
    """
    given = Path(run).expanduser()
    named = workspace / ".osmosis" / "train" / run
    run_dir = next((p for p in (given, named) if (p / RUN_FILES.checkpoints).is_dir()), None)
    if run_dir is None:
        raise ConfigError(
            f"no training run {run!r} with checkpoints: it is neither a run directory nor a "
            f"run in {named.parent}; give the run's directory or its name from the workspace"
        )
    checkpoints = run_dir / RUN_FILES.checkpoints
    kept = checkpoint_steps(checkpoints)
    if step is None:
        latest = checkpoints / "latest"
        if latest.is_dir():
            return latest.resolve()
        if not kept:
            raise ConfigError(f"run {str(run_dir)!r} has no checkpoint yet")
        step = max(kept)
    directory = kept.get(step)
    if directory is None or not directory.is_dir():
        steps = ", ".join(map(str, kept)) or "none"
        raise ConfigError(
            f"run {str(run_dir)!r} has no checkpoint of step {step}; it keeps step(s) {steps} "
            "([checkpoints] keep sets how many)"
        )
    return directory.resolve()


def export_merged(checkpoint: Path, out: Path) -> Exported:
    """Write ``checkpoint`` (full or LoRA) to ``out`` as a standalone model (blocking).

    ``out`` is written whole: into a temporary directory beside it, renamed into place.

    Raises:
        ConfigError: ``out`` exists and is not empty, the checkpoint is incomplete (its
            base model missing, for an adapter), or the adapter cannot be merged.
    """
    check_model_dir(checkpoint)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{str(out)!r} already exists and is not empty; give a new directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    adapter = is_adapter_dir(checkpoint)
    try:
        if adapter:
            _merge(checkpoint, temp)
        else:
            for path in checkpoint.iterdir():
                if path.is_file() and path.name not in _TRAINER_FILES:
                    shutil.copy2(path, temp / path.name)
        if out.exists():
            out.rmdir()  # empty, checked above
        temp.rename(out)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return Exported(out, checkpoint, adapter)


def _merge(checkpoint: Path, into: Path) -> None:
    """Merge in fp32, then save in the base model's own dtype (a bf16 base stays bf16)."""
    stated = _stated_dtype(adapter_base(checkpoint))
    try:
        with quiet_transformers():
            model, tokenizer = load_model_dir(checkpoint, feature=_FEATURE)
            if stated is not None:
                model = model.to(stated)
            model.save_pretrained(str(into))
            tokenizer.save_pretrained(str(into))
    except (ConfigError, ModuleNotFoundError):
        raise
    except Exception as exc:  # peft or transformers refusing this adapter or base model
        raise ConfigError(
            f"could not merge the LoRA checkpoint {str(checkpoint)!r} into its base model: "
            f"{type(exc).__name__}: {exc}"
        ) from None


def _stated_dtype(model_dir: Path) -> Any:
    """The half-precision torch dtype ``model_dir``'s config.json states, else ``None``."""
    try:
        stated = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = (stated.get("dtype") or stated.get("torch_dtype")) if isinstance(stated, dict) else None
    if name not in ("bfloat16", "float16"):
        return None
    import torch

    return getattr(torch, name)
