"""HuggingFace-format model directories: what one must hold, and loading one offline.

A directory holds a whole model (``config.json`` and weights) or a LoRA adapter
(``adapter_config.json`` and adapter weights, naming its base model's directory), with a
tokenizer either way. The torch policy, the trainer's model source and its export share
these. Nothing is ever fetched from a model hub: a directory is checked on disk first, and
loading passes ``local_files_only``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.policies._cpu_threads import use_default_torch_threads

__all__ = [
    "ADAPTER_CONFIG",
    "adapter_base",
    "check_model_dir",
    "import_peft",
    "import_torch_stack",
    "import_llguidance",
    "is_adapter_dir",
    "load_model_dir",
    "quiet_peft",
    "quiet_transformers",
    "read_adapter_config",
]

#: The file that makes a directory a LoRA adapter (peft's ``save_pretrained``).
ADAPTER_CONFIG = "adapter_config.json"
_ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")

_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_TOKENIZER = ("tokenizer.json", "tokenizer.model")


def import_torch_stack(feature: str) -> tuple[ModuleType, ModuleType]:
    """``(torch, transformers)``, or an error naming the ``train`` extra. torch computes on
    ``default_threads()`` threads unless ``OMP_NUM_THREADS`` says otherwise.

    Raises:
        MissingExtraError: torch or transformers is not installed.
    """
    torch = import_optional("torch", extra="train", feature=feature)
    transformers = import_optional("transformers", extra="train", feature=feature)
    use_default_torch_threads(torch)
    return torch, transformers


def import_llguidance(feature: str) -> ModuleType:
    """llguidance (grammars of tool calls and JSON), or an error naming the ``train`` extra.

    Raises:
        MissingExtraError: llguidance is not installed.
    """
    return import_optional("llguidance", extra="train", feature=feature)


def import_peft(feature: str) -> ModuleType:
    """peft (LoRA), or an error naming the ``train`` extra."""
    return import_optional("peft", extra="train", feature=feature)


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' progress bars and warnings off while we load or save (restored after).

    They would interleave "Loading weights" and "Writing model shards" bars with the run's
    own output at every checkpoint.
    """
    hf_logging = import_optional(
        "transformers.utils.logging", extra="train", feature="Loading a transformers model"
    )
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


@contextmanager
def quiet_peft() -> Iterator[None]:
    """peft 0.21 asks transformers 5.2x a deprecated question (``is_gradient_checkpointing``)
    whenever it wraps a model; its FutureWarning says nothing to our users."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        yield


def is_adapter_dir(path: Path) -> bool:
    """Whether ``path`` holds a LoRA adapter rather than a whole model."""
    return (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


def read_adapter_config(path: Path) -> dict[str, Any]:
    """The ``adapter_config.json`` of the LoRA checkpoint in ``path``.

    Raises:
        ConfigError: It cannot be read, or is not a JSON object.
    """
    try:
        stated = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"LoRA checkpoint {str(path)!r}: {ADAPTER_CONFIG} is unreadable ({exc})"
        ) from None
    if not isinstance(stated, dict):
        raise ConfigError(f"LoRA checkpoint {str(path)!r}: {ADAPTER_CONFIG} is not an object")
    return stated


def adapter_base(path: Path) -> Path:
    """The base model directory the LoRA adapter in ``path`` was trained on, checked.

    Raises:
        ConfigError: The adapter names no base directory, or one that is not here.
    """
    base = read_adapter_config(path).get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise ConfigError(
            f"LoRA checkpoint {str(path)!r}: {ADAPTER_CONFIG} names no base_model_name_or_path"
        )
    if not Path(base).is_dir():
        raise ConfigError(
            f"LoRA checkpoint {str(path)!r} was trained on base model {base!r}, which is not a "
            "directory here; put the base model there, or export a merged model with "
            "`osmosis train export` where it is"
        )
    return check_model_dir(Path(base))


def check_model_dir(path: Path) -> Path:
    """``path`` resolved, if it is a directory with a config, weights and a tokenizer, or a
    LoRA adapter with its weights, a tokenizer and a base model directory that is here.

    Raises:
        ConfigError: It is not a directory, or lacks one of them; the message names each
            missing file and how to write it.
    """
    if not path.is_dir():
        raise ConfigError(
            f"model directory {str(path)!r} does not exist; give a directory written by "
            "save_pretrained (config.json, weights, tokenizer) or 'embedded'"
        )
    if is_adapter_dir(path):
        return _check_adapter_dir(path)
    missing: list[str] = []
    if not (path / "config.json").is_file():
        missing.append("config.json (write it with model.save_pretrained(dir))")
    if not any((path / name).is_file() for name in _WEIGHTS):
        missing.append(
            "weights: "
            + " or ".join(_WEIGHTS[::2])
            + " (write them with model.save_pretrained(dir))"
        )
    missing.extend(_missing_tokenizer(path))
    if missing:
        raise ConfigError(f"model directory {str(path)!r} has no " + "; no ".join(missing))
    return path.resolve()


def _check_adapter_dir(path: Path) -> Path:
    missing = _missing_tokenizer(path)
    if not any((path / name).is_file() for name in _ADAPTER_WEIGHTS):
        missing.insert(0, "adapter weights: " + " or ".join(_ADAPTER_WEIGHTS))
    if missing:
        raise ConfigError(f"LoRA checkpoint {str(path)!r} has no " + "; no ".join(missing))
    adapter_base(path)
    return path.resolve()


def _missing_tokenizer(path: Path) -> list[str]:
    if any((path / name).is_file() for name in _TOKENIZER):
        return []
    tokenizer = " or ".join(_TOKENIZER)
    return [f"a tokenizer: {tokenizer} (write it with tokenizer.save_pretrained(dir))"]


def load_model_dir(path: Path, *, feature: str, device: Any = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a checked directory, in float32 and eval mode, on
    ``device`` (the CPU by default); a LoRA adapter is merged into its base (blocking).

    Raises:
        ConfigError: See `check_model_dir`.
        MissingExtraError: torch, transformers or (for an adapter) peft is not installed.
    """
    directory = check_model_dir(path)
    torch, transformers = import_torch_stack(feature)
    adapter = is_adapter_dir(directory)
    with quiet_transformers():  # no "Loading weights" bar in the caller's output
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(adapter_base(directory) if adapter else directory),
            local_files_only=True,
            dtype=torch.float32,
        )
        if adapter:
            peft = import_peft(feature)
            with quiet_peft():
                model = peft.PeftModel.from_pretrained(model, str(directory)).merge_and_unload()
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(directory), local_files_only=True
        )
    if device is not None:
        model = model.to(device)
    return model.eval(), tokenizer
