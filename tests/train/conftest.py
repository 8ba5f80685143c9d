"""Training fixtures: a tiny random-initialised Llama with the embedded model's real tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from osmosis_ai.gateway.policies._llama import embedded_model_path


def save_tiny_model(directory: Path, tokenizer_dir: Path, *, seed: int = 0) -> Path:
    """Save a random 2-layer Llama (hidden size 64) and the tokenizer into ``directory``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model's tokenizer (read from its GGUF file, ~5 s), saved once."""
    from transformers import AutoTokenizer

    gguf = embedded_model_path()
    tokenizer = AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, local_files_only=True
    )
    directory = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    """A checkpoint directory of a tiny random Llama with a real tokenizer (no download)."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"), tokenizer_dir)
