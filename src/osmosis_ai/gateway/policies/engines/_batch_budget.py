"""How many calls the torch engine generates together: as many as their KV cache has room for.

A call's cache grows to ``prompt + max_tokens`` tokens, and the rows of a batch are
left-padded to the longest, so a batch of ``n`` calls holds at most ``n × longest`` tokens'
keys and values. `BatchBudget.fits` admits calls while that stays within a byte budget (a
share of the memory free when the engine starts) and a count (the ``max_batch_size``
setting); the first call of an empty batch is always admitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BatchBudget", "kv_bytes_per_token"]

#: The share of the free memory the cache of one batch may take.
CACHE_SHARE = 0.25
#: The cache budget when the free memory cannot be told.
FALLBACK_CACHE_BYTES = 2 << 30


def kv_bytes_per_token(config: Any, itemsize: int) -> int:
    """Bytes of keys and values one token takes in the cache of a model of ``config`` whose
    weights (and so its cache) have ``itemsize`` bytes per element."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    return 2 * int(text.num_hidden_layers) * kv_heads * head_dim * itemsize


@dataclass(frozen=True, slots=True)
class BatchBudget:
    """What a batch may hold: at most ``max_calls`` calls, and their padded cache within
    ``cache_bytes``."""

    max_calls: int
    cache_bytes: int
    bytes_per_token: int

    @classmethod
    def of(
        cls,
        config: Any,
        itemsize: int,
        *,
        max_calls: int,
        cache_bytes: int | None = None,
        free_bytes: int | None = None,
    ) -> BatchBudget:
        """The budget of a model of ``config``: ``cache_bytes`` when given, else a share of
        the memory free for it."""
        if cache_bytes is None:
            cache_bytes = FALLBACK_CACHE_BYTES
            if free_bytes is not None:
                cache_bytes = int(free_bytes * CACHE_SHARE)
        return cls(max_calls, cache_bytes, kv_bytes_per_token(config, itemsize))

    def fits(self, reaches: Sequence[int]) -> bool:
        """Whether calls whose caches grow to ``reaches`` tokens may generate together."""
        if len(reaches) > self.max_calls:
            return False
        return len(reaches) * max(reaches, default=0) * self.bytes_per_token <= self.cache_bytes
