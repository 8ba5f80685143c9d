"""The torch policy: a transformers checkpoint (or a live model) served by the torch engine."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.policies.chat_front import ChatFront
from osmosis_ai.gateway.policies.engine_policy import EnginePolicy
from osmosis_ai.gateway.policies.engines.torch import DEFAULT_MAX_BATCH_SIZE, TorchEngine
from osmosis_ai.gateway.policies.hf_dir import check_model_dir, load_model_dir
from osmosis_ai.gateway.policies.torch_device import resolve_device

__all__ = ["TorchPolicy"]

_FEATURE = "The torch policy"


class TorchPolicy(EnginePolicy):
    """Serves a transformers causal LM from torch weights: a `ChatFront` on a `TorchEngine`.

    See `TorchEngine` for the batching and the exactness of the recorded logprobs, and
    `ChatFront` for the tool calls (the embedded policy's contract, under a JSON grammar)
    and the answers. ``policy.engine.updating()`` changes the weights between calls.

    Args:
        model_dir: A directory written by ``save_pretrained`` (weights and tokenizer), or a
            LoRA checkpoint (served merged into the base model it names).
        model: A live model to serve instead; needs ``tokenizer``.
        tokenizer: The live model's tokenizer.
        name: The model name reported; defaults to the directory's name.
        version: The initial weight version (training step).
        device: Where a checkpoint is loaded: ``auto`` (CUDA when torch sees a GPU), ``cpu``,
            ``cuda``, ``cuda:N`` or ``mps``. A live model stays where it is.
        max_batch_size: Most calls generated together (fewer when their KV cache would
            not fit in a quarter of the device's free memory).
        batch_window_sec: How long a batch waits for one more call before it starts.
        default_max_tokens: Completion cap when a request sets none; by default the
            checkpoint's ``generation_config.max_new_tokens``, else 1,024.
        max_string_length: ``maxLength`` given to unbounded strings in tool arguments.
        answer_after_tool_result: Constrain an ``auto`` turn right after a tool result to
            an answer, as the embedded policy does.

    Raises:
        ConfigError: Neither or both of a directory and a live model are given, or the
            directory lacks its config, weights or tokenizer.
    """

    kind = "torch"

    def __init__(
        self,
        model_dir: Path | str | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        name: str | None = None,
        version: int = 0,
        device: str = "auto",
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        batch_window_sec: float = 0.01,
        default_max_tokens: int | None = None,
        max_string_length: int = 64,
        answer_after_tool_result: bool = True,
    ) -> None:
        if (model is None) == (model_dir is None) or (model is None) != (tokenizer is None):
            raise ConfigError(
                "TorchPolicy serves either a checkpoint directory (model_dir) or a live model "
                "(model and tokenizer together); give one of the two"
            )
        self.model_dir = check_model_dir(Path(model_dir)) if model_dir is not None else None
        super().__init__(name=name or (self.model_dir.name if self.model_dir else "torch-policy"))
        self.device = device
        self._engine_of = functools.partial(
            TorchEngine,
            version=version,
            max_batch_size=max_batch_size,
            batch_window_sec=batch_window_sec,
        )
        self._front_of = functools.partial(
            ChatFront.of_model,
            default_max_tokens=default_max_tokens,
            max_string_length=max_string_length,
            answer_after_tool_result=answer_after_tool_result,
        )
        if model is not None:
            self._serve(model, tokenizer)

    def _serve(self, model: Any, tokenizer: Any) -> None:
        self._attach(self._front_of(model, tokenizer), self._engine_of(model, tokenizer))

    async def start(self) -> None:
        """Load the checkpoint (on a worker thread) if that is what is served, then start."""
        if self._parts is None:
            assert self.model_dir is not None
            self._serve(*await asyncio.to_thread(self._load, self.model_dir))
        await super().start()

    def _load(self, directory: Path) -> tuple[Any, Any]:
        device = resolve_device(self.device, feature=_FEATURE)
        return load_model_dir(directory, feature=_FEATURE, device=device)
