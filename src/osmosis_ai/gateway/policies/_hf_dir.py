"""HuggingFace-format model directories: what one must hold, and loading one offline.

The torch policy and the trainer's model source share these. Nothing is ever fetched from a
model hub: a directory is checked on disk first, and loading passes ``local_files_only``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError, MissingExtraError

__all__ = ["check_model_dir", "import_torch_stack", "import_xgrammar", "load_model_dir"]

_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_TOKENIZER = ("tokenizer.json", "tokenizer.model")
# xgrammar's declared dependencies pull triton (GPU only), so it is installed without them.
_INSTALL_XGRAMMAR = "pip install --no-deps xgrammar && pip install apache-tvm-ffi"


def import_torch_stack(feature: str) -> tuple[ModuleType, ModuleType]:
    """``(torch, transformers)``, or an error naming the ``train`` extra.

    Raises:
        MissingExtraError: torch or transformers is not installed.
    """
    torch = import_optional("torch", extra="train", feature=feature)
    transformers = import_optional("transformers", extra="train", feature=feature)
    return torch, transformers


def import_xgrammar(feature: str) -> ModuleType:
    """The xgrammar module, or an error giving its (no-deps) install command.

    Raises:
        MissingExtraError: xgrammar is not installed.
    """
    # Not part of the extra's requirements (see _INSTALL_XGRAMMAR), so not import_optional.
    try:
        return importlib.import_module("xgrammar")
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in ("xgrammar", "tvm_ffi"):
            raise
        raise MissingExtraError(feature, "train", exc.name, install=_INSTALL_XGRAMMAR) from exc


def check_model_dir(path: Path) -> Path:
    """``path`` resolved, if it is a directory with a config, weights and a tokenizer.

    Raises:
        ConfigError: It is not a directory, or lacks one of them; the message names each
            missing file and how to write it.
    """
    if not path.is_dir():
        raise ConfigError(
            f"model directory {str(path)!r} does not exist; give a directory written by "
            "save_pretrained (config.json, weights, tokenizer) or 'embedded'"
        )
    missing: list[str] = []
    if not (path / "config.json").is_file():
        missing.append("config.json (write it with model.save_pretrained(dir))")
    if not any((path / name).is_file() for name in _WEIGHTS):
        missing.append(
            "weights: "
            + " or ".join(_WEIGHTS[::2])
            + " (write them with model.save_pretrained(dir))"
        )
    if not any((path / name).is_file() for name in _TOKENIZER):
        missing.append(
            "a tokenizer: "
            + " or ".join(_TOKENIZER)
            + " (write it with tokenizer.save_pretrained(dir))"
        )
    if missing:
        raise ConfigError(f"model directory {str(path)!r} has no " + "; no ".join(missing))
    return path.resolve()


def load_model_dir(path: Path, *, feature: str) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a checked directory, in float32 and eval mode (blocking).

    Raises:
        ConfigError: See `check_model_dir`.
        MissingExtraError: torch or transformers is not installed.
    """
    directory = str(check_model_dir(path))
    torch, transformers = import_torch_stack(feature)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, local_files_only=True, dtype=torch.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return model.eval(), tokenizer
