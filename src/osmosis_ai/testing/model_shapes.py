"""Randomly initialised models of real shapes: no download, no weights to copy.

A model of SmolLM2-135M's or Qwen2.5-1.5B's shape (or of any HuggingFace ``config.json``)
computes, allocates and batches like the real one, so device and throughput checks mean
something without the real weights: only a tokenizer (a few MB) is needed. Its answers are
noise, of course. Needs torch and transformers (the ``train`` extra).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.policies.hf_dir import import_torch_stack

__all__ = ["SHAPES", "model_config", "write_random_model"]

_FEATURE = "osmosis_ai.testing.model_shapes"

#: Named shapes: the architecture fields of each model's ``config.json``.
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
    "qwen2.5-1.5b": {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
    },
}


def model_config(
    shape: str | Path, tokenizer: Any, overrides: Mapping[str, Any] | None = None
) -> Any:
    """The transformers config of ``shape`` (a name in `SHAPES` or a ``config.json`` path)
    with ``overrides``, its vocabulary sized to ``tokenizer`` (so every sampled id decodes)
    and its special tokens the tokenizer's.

    Raises:
        ConfigError: An unknown shape name, or a config file that cannot be read.
    """
    _, transformers = import_torch_stack(_FEATURE)
    if isinstance(shape, str) and shape in SHAPES:
        fields = dict(SHAPES[shape])
    elif Path(shape).is_file():
        try:
            fields = json.loads(Path(shape).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model config {str(shape)!r} is unreadable ({exc})") from None
    else:
        raise ConfigError(
            f"model shape {str(shape)!r} is neither one of {', '.join(SHAPES)} nor a config.json"
        )
    fields.update(overrides or {})
    fields.update(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id
        if tokenizer.pad_token_id is not None
        else tokenizer.eos_token_id,
    )
    model_type = fields.pop("model_type", None)
    if not isinstance(model_type, str):
        raise ConfigError(f"model config {str(shape)!r} names no model_type")
    return transformers.AutoConfig.for_model(model_type, **fields)


def write_random_model(
    directory: Path,
    shape: str | Path,
    tokenizer_dir: Path,
    *,
    seed: int = 0,
    overrides: Mapping[str, Any] | None = None,
) -> Path:
    """Save a random model of ``shape`` and the tokenizer of ``tokenizer_dir`` into
    ``directory`` (``save_pretrained``: a checkpoint `TorchPolicy` and the trainer load).

    The same seed gives the same weights. Blocking.
    """
    torch, transformers = import_torch_stack(_FEATURE)
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        str(tokenizer_dir), local_files_only=True
    )
    config = model_config(shape, tokenizer, overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory
