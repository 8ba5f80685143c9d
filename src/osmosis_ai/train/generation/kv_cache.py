"""The KV cache a managed vLLM server gets on the CPU when the user sets none.

vLLM's CPU backend otherwise asks for a share of the machine's whole memory
(``--gpu-memory-utilization``, 0.92 there): on a 24 GB machine with 20 GB free it refuses to
start, and where it starts it leaves the learner nothing. What the rollouts in flight can
fill is known: each holds at most ``max_model_len`` tokens, and a token costs
``2 (K and V) x layers x KV heads x head size x bytes`` of cache. The server gets that, at
most a quarter of the memory free when it starts (the learner's gradients and optimiser
state are allocated later, at its first update), and at least one full-length sequence
(vLLM refuses to start with less).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["KvCacheSize", "cpu_kv_cache", "kv_bytes_per_token"]

#: The most of the free memory the KV cache takes.
FREE_MEMORY_SHARE = 0.25
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}
_MIB = 1 << 20


@dataclass(frozen=True)
class KvCacheSize:
    """A KV cache size and how it was reached (for the run's log)."""

    bytes: int
    wanted: int
    """What the rollouts in flight could fill."""
    cap: int
    """A quarter of the free memory."""

    def describe(self) -> str:
        gib = 1 << 30
        limit = "all of it" if self.bytes >= self.wanted else f"capped at {self.cap / gib:.1f}"
        return (
            f"vLLM's KV cache on the CPU: {self.bytes / gib:.2f} GiB (the rollouts in flight "
            f"could fill {self.wanted / gib:.2f} GiB; {limit} GiB, a quarter of the free "
            "memory); set [engine.vllm] args --kv-cache-memory-bytes to choose"
        )


def kv_bytes_per_token(model_config: Mapping[str, Any], dtype: str = "auto") -> int | None:
    """Bytes of KV cache per token of a HuggingFace ``config.json`` (its ``text_config`` for a
    multimodal model) in ``dtype`` (``auto``: the model's own); ``None`` when the config
    does not say (an architecture without these fields)."""
    config = model_config.get("text_config") or model_config
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    if dtype == "auto":
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    return 2 * layers * kv_heads * head_dim * _DTYPE_BYTES.get(dtype, 2)


def cpu_kv_cache(
    model_dir: Path, *, dtype: str, max_model_len: int, sequences: int, free_bytes: int
) -> KvCacheSize:
    """The KV cache for ``sequences`` in flight of the model in ``model_dir`` (see the module
    docstring); ``max_model_len`` 0 means the model's own context length."""
    config = json.loads((model_dir / "config.json").read_text())
    text = config.get("text_config") or config
    length = max_model_len or int(text.get("max_position_embeddings") or 4096)
    cap = int(free_bytes * FREE_MEMORY_SHARE)
    per_token = kv_bytes_per_token(config, dtype)
    if per_token is None:  # nothing to derive from: the cap alone
        return KvCacheSize(bytes=_round_up(cap), wanted=cap, cap=cap)
    wanted = per_token * length * max(1, sequences)
    least = per_token * length
    return KvCacheSize(bytes=_round_up(max(least, min(wanted, cap))), wanted=wanted, cap=cap)


def _round_up(size: int) -> int:
    return math.ceil(size / _MIB) * _MIB
