"""The KV cache a managed vLLM server gets on the CPU: per-token bytes from a model's config,
what the rollouts in flight could fill, capped at a quarter of the free memory, at least one
full-length sequence."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from osmosis_ai.gateway.policies.torch_device import available_memory_bytes
from osmosis_ai.train.generation.kv_cache import cpu_kv_cache, kv_bytes_per_token

MIB, GIB = 1 << 20, 1 << 30
#: SmolLM2-135M's shape (the embedded model): 30 layers, 3 KV heads of 64, fp32 weights.
SMOLLM2: dict[str, Any] = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "hidden_size": 576,
    "max_position_embeddings": 8192,
    "dtype": "float32",
}


def _model(tmp_path: Path, config: dict[str, Any]) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_bytes_per_token_are_k_and_v_of_every_layer() -> None:
    assert kv_bytes_per_token(SMOLLM2) == 2 * 30 * 3 * 64 * 4 == 46_080
    assert kv_bytes_per_token(SMOLLM2, "bfloat16") == 23_040
    # No head_dim: hidden_size / heads; no KV heads: every head has its own.
    plain = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}
    assert kv_bytes_per_token(plain) == 2 * 2 * 4 * 16 * 2
    assert kv_bytes_per_token({"text_config": SMOLLM2}) == 46_080
    assert kv_bytes_per_token({"model_type": "mamba"}) is None


def test_the_cache_holds_the_rollouts_in_flight_within_a_quarter_of_the_free_memory(
    tmp_path: Path,
) -> None:
    model = _model(tmp_path, SMOLLM2)
    wanted = 46_080 * 2048 * 16  # 1,440 MiB
    size = cpu_kv_cache(model, dtype="auto", max_model_len=2048, sequences=16, free_bytes=20 * GIB)
    assert (size.bytes, size.wanted, size.cap) == (wanted, wanted, 5 * GIB)
    assert "1.41 GiB" in size.describe() and "all of it" in size.describe()
    capped = cpu_kv_cache(model, dtype="auto", max_model_len=2048, sequences=16, free_bytes=4 * GIB)
    assert capped.bytes == GIB and "capped at 1.0 GiB" in capped.describe()
    # Never below one full-length sequence (vLLM refuses to start with less).
    least = cpu_kv_cache(model, dtype="auto", max_model_len=2048, sequences=16, free_bytes=MIB)
    assert least.bytes == 46_080 * 2048
    # max_model_len 0: the model's own context length.
    own = cpu_kv_cache(model, dtype="bfloat16", max_model_len=0, sequences=1, free_bytes=20 * GIB)
    assert own.bytes == 23_040 * 8192


def test_a_config_without_the_shape_gets_the_cap(tmp_path: Path) -> None:
    model = _model(tmp_path, {"model_type": "mamba"})
    size = cpu_kv_cache(model, dtype="auto", max_model_len=0, sequences=8, free_bytes=8 * GIB)
    assert size.bytes == 2 * GIB


def test_free_memory_is_within_the_machines_memory() -> None:
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    free = available_memory_bytes()
    assert free is not None and 0 < free <= total
