"""Finished calls' keys and values, kept for later calls whose prompt starts the same way.

An agent's next turn sends the whole conversation again: its prompt is the previous call's
prompt and completion, then a tool result. The torch engine keeps each finished call's cache
here (the keys and values of its prompt and completion, one row), and a call whose prompt
begins with stored tokens is prefilled from the first token they do not cover; the rest is
computed as before. Entries are whole sequences; an entry another one extends is dropped
(the longer serves every prompt the shorter did), the least recently used go first when the
store is over its bytes, and the whole store is emptied whenever the weights change (keys
and values of older weights would give other logprobs than the policy's).

Only for models whose every layer attends to the whole sequence: a sliding-window layer's
cache keeps only its window, a recurrent layer's a state.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MIN_REUSED_TOKENS", "PrefixHit", "PrefixStore"]

#: The fewest stored tokens worth a prefill of its own: a shorter common beginning (a chat
#: template's first tokens) would only take a prompt out of the batched prefill.
MIN_REUSED_TOKENS = 16


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """The stored keys and values of a prompt's first ``length`` tokens."""

    length: int
    layers: list[tuple[Any, Any]]
    """Per layer, keys and values ``[1, heads, ≥ length, head size]`` (slice to ``length``)."""


class PrefixStore:
    """Keys and values of finished sequences, by their tokens, within ``max_bytes``
    (used on the engine's worker thread, emptied while no generation runs)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[tuple[int, ...], list[tuple[Any, Any]]] = (
            collections.OrderedDict()
        )
        self._bytes = 0
        #: Prompt tokens whose prefill the store saved, and the calls it served.
        self.reused_tokens = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, tokens: Sequence[int], layers: list[tuple[Any, Any]]) -> None:
        """Keep the keys and values of ``tokens`` (owned by the store: not views of a
        batch's cache); entries that ``tokens`` extends are dropped."""
        key = tuple(tokens)
        size = _bytes(layers)
        if not key or size > self.max_bytes:
            return
        for stored in [k for k in self._entries if len(k) <= len(key) and key[: len(k)] == k]:
            self._drop(stored)
        self._entries[key] = layers
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def lookup(self, prompt: Sequence[int]) -> PrefixHit | None:
        """The stored sequence sharing the longest beginning with ``prompt``, up to its last
        token but one (whose logits the prefill computes), or ``None`` when none shares
        `MIN_REUSED_TOKENS`."""
        best: tuple[int, tuple[int, ...]] | None = None
        wanted, limit = tuple(prompt), len(prompt) - 1
        for stored in self._entries:
            length = min(len(os.path.commonprefix([stored, wanted])), limit)
            if length >= MIN_REUSED_TOKENS and (best is None or length > best[0]):
                best = (length, stored)
        if best is None:
            return None
        length, stored = best
        self._entries.move_to_end(stored)
        self.hits += 1
        self.reused_tokens += length
        return PrefixHit(length, self._entries[stored])

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def _drop(self, key: tuple[int, ...]) -> None:
        self._bytes -= _bytes(self._entries.pop(key))


def _bytes(layers: list[tuple[Any, Any]]) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
