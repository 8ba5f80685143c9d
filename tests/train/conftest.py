"""Training fixtures: tiny random-initialised Llamas built from a config (no download), and
hand-made training sequences."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from osmosis_ai.gateway.policies.llama import embedded_model_path
from osmosis_ai.train.algorithm.sequences import TrainingSequence
from osmosis_ai.train.model import save_gguf_tokenizer

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

#: The vocabulary of the tokenizer-less tiny model (GRPO mechanics and the learning test).
VOCAB = 16


def tiny_llama(
    seed: int = 0, *, vocab_size: int = VOCAB, hidden_size: int = 32, **config: Any
) -> LlamaForCausalLM:
    """A random 2-layer Llama, the same for a seed; ``config`` adds LlamaConfig fields."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            **{"max_position_embeddings": 64, **config},
        )
    )


@pytest.fixture
def model() -> LlamaForCausalLM:
    return tiny_llama()


def make_sequence(
    rollout: str,
    group: str,
    reward: float,
    tokens: Sequence[int] = (1, 2, 3, 4),
    mask: Sequence[int] | None = None,
    logprobs: Sequence[float] | None = None,
) -> TrainingSequence:
    """A training sequence; by default its first two tokens are context, the rest policy
    tokens with behaviour logprob -1."""
    mask = mask if mask is not None else [0, 0] + [1] * (len(tokens) - 2)
    behaviour = logprobs if logprobs is not None else [-1.0 * m for m in mask]
    return TrainingSequence(
        rollout_id=rollout,
        group_id=group,
        reward=reward,
        token_ids=tuple(tokens),
        loss_mask=tuple(mask),
        behaviour_logprobs=tuple(behaviour),
    )


def on_policy(model: Any, sequences: Sequence[TrainingSequence]) -> list[TrainingSequence]:
    """``sequences`` with the model's own logprobs (in its current mode) as their behaviour
    logprobs: the tokens it would have sampled them with."""
    import torch

    from osmosis_ai.train.algorithm.logprobs import policy_logprobs
    from osmosis_ai.train.algorithm.micro_batches import collate

    batch = collate(list(sequences), [0.0] * len(sequences), [1.0] * len(sequences))
    with torch.no_grad():
        logprobs = policy_logprobs(model, batch)
    return [
        replace(s, behaviour_logprobs=(0.0, *logprobs[row, : len(s) - 1].tolist()))
        for row, s in enumerate(sequences)
    ]


def save_tiny_model(directory: Path, tokenizer_dir: Path, *, seed: int = 0) -> Path:
    """Save a random 2-layer Llama (hidden size 64) and the tokenizer into ``directory``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    tiny_llama(
        seed,
        vocab_size=len(tokenizer),
        hidden_size=64,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(str(directory))
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
    save_gguf_tokenizer(tokenizer, directory)
    return directory


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    """A checkpoint directory of a tiny random Llama with a real tokenizer (no download)."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"), tokenizer_dir)


#: A hermes-style chat template (tools in the system turn, ``<tool_call>`` JSON), as models
#: with native tool calls ship one.
HERMES_TEMPLATE = Path(__file__).resolve().parents[1] / "gateway" / "templates" / "hermes.jinja"


def with_chat_template(source: Path, directory: Path, template: Path = HERMES_TEMPLATE) -> Path:
    """A copy of the model directory ``source`` whose tokenizer has ``template``."""
    shutil.copytree(source, directory)
    (directory / "chat_template.jinja").write_text(template.read_text())
    return directory


@pytest.fixture(scope="session")
def hermes_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The tiny model with a chat template that renders tools and hermes tool calls."""
    return with_chat_template(tiny_model_dir, tmp_path_factory.mktemp("hermes") / "model")


def first_turn_calls(source: str) -> str:
    """The calculator example's ``main.py`` with a first turn that must call a tool
    (``tool_choice`` "required"; the turns after a tool result stay free): SmolLM2 was never
    taught hermes calls and answers in prose when free to. That turn makes one call
    (``parallel_tool_calls`` false): left to make several, the model writes call after call
    until ``max_tokens`` cuts the last one, and a cut reply parses as text, as vLLM's does."""
    tools = '"tools": [CALCULATOR],'
    assert tools in source
    first = "len(messages) <= 2"
    required = f'"tool_choice": "required" if {first} else "auto",'
    single = f'"parallel_tool_calls": not ({first}),'
    return source.replace(tools, f"{tools}\n{required}\n{single}")
