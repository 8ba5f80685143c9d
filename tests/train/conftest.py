"""Training fixtures: a tiny random-initialised Llama, built from a config (no download)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 16


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer Llama with a 16-token vocabulary and hidden size 32, the same for a seed."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


@pytest.fixture
def model() -> LlamaForCausalLM:
    return tiny_llama()
