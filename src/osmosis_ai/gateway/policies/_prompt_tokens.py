"""Exact prompt tokenisation that does not re-tokenise the text it has already seen.

An agent's calls resend the whole conversation, so each call's rendered prompt is the
previous one plus a few messages. A Hugging Face fast tokenizer first cuts its input at
added tokens (``<|im_start|>``, ``<|im_end|>``...) and then encodes each piece between them
on its own: a prompt's ids are its pieces' ids laid end to end. ``PieceTokenizer`` caches
the ids of each piece, so a call encodes only its new text. It is offered only for
tokenizers where that holds exactly (see ``PieceTokenizer.of``).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

__all__ = ["PieceTokenizer"]

#: Characters of pieces whose ids are kept (least recently used dropped first; about 10
#: bytes per character with the ids): a piece is about one message, so this holds the
#: conversations of many concurrent rollouts in some 40 MB.
MAX_CACHED_CHARS = 4_000_000
#: Pre-tokenizers that treat the first piece of an input apart (Metaspace's
#: ``prepend_scheme="first"``): encoding pieces one by one would differ.
_POSITIONAL_PRE_TOKENIZERS = ("Metaspace",)


class PieceTokenizer:
    """Encodes text as ``tokenizer(text, add_special_tokens=False)`` does, piece by piece.

    Thread-safe (prompts are encoded in worker threads). Build it with ``PieceTokenizer.of``.
    """

    def __init__(self, backend: Any, added: dict[str, int]) -> None:
        self._backend = backend
        self._added = added
        # Longest first: a regex alternation takes the first alternative that matches where
        # the tokenizer takes the longest added token.
        alternation = "|".join(re.escape(token) for token in sorted(added, key=len, reverse=True))
        self._split = re.compile(f"({alternation})")
        self.max_cached_chars = MAX_CACHED_CHARS
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._cached_chars = 0
        self._lock = threading.Lock()

    @property
    def cached_chars(self) -> int:
        """Characters of the pieces whose ids are cached (at most ``max_cached_chars``)."""
        return self._cached_chars

    @classmethod
    def of(cls, tokenizer: Any) -> PieceTokenizer | None:
        """A piece tokenizer for a Hugging Face fast ``tokenizer``, or None where encoding
        piece by piece could differ from encoding the whole text: no Rust backend, special
        tokens split as text, an added token that strips its neighbours, matches whole
        words only or matches after normalisation, or a position-dependent pre-tokenizer."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or getattr(tokenizer, "split_special_tokens", False):
            return None
        added = backend.get_added_tokens_decoder()
        if not added or any(
            token.lstrip or token.rstrip or token.single_word or token.normalized
            for token in added.values()
        ):
            return None
        if any(name in repr(backend.pre_tokenizer) for name in _POSITIONAL_PRE_TOKENIZERS):
            return None
        return cls(backend, {token.content: int(index) for index, token in added.items()})

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, without special tokens added around it (blocking CPU work)."""
        return self._encode_parts(self._split.split(text))

    def encode_if_known(self, text: str, max_new_chars: int) -> list[int] | None:
        """``encode(text)`` when at most ``max_new_chars`` characters of it are in pieces not
        cached yet (little work, fit for the event loop); otherwise ``None``, having encoded
        nothing. The text is split once for both."""
        parts = self._split.split(text)
        with self._lock:
            new_chars = sum(len(piece) for piece in parts[::2] if piece not in self._cache)
        return self._encode_parts(parts) if new_chars <= max_new_chars else None

    def _encode_parts(self, parts: list[str]) -> list[int]:
        ids: list[int] = []
        # With one capturing group, split() alternates text pieces and added tokens.
        for position, piece in enumerate(parts):
            if position % 2:
                ids.append(self._added[piece])
            elif piece:
                ids.extend(self._piece(piece))
        return ids

    def _piece(self, piece: str) -> tuple[int, ...]:
        with self._lock:
            cached = self._cache.get(piece)
            if cached is not None:
                self._cache.move_to_end(piece)
                return cached
        ids = tuple(self._backend.encode(piece, add_special_tokens=False).ids)
        if len(piece) > self.max_cached_chars:
            return ids
        with self._lock:
            if piece not in self._cache:
                self._cache[piece] = ids
                self._cached_chars += len(piece)
                while self._cached_chars > self.max_cached_chars:  # ends: the cache shrinks
                    dropped, _ = self._cache.popitem(last=False)
                    self._cached_chars -= len(dropped)
        return ids
