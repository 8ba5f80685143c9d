"""Unguessable tokens that never repeat, without a system call each.

`secrets.token_bytes` per call is a ``getrandom`` system call, which on loaded virtual
machines cost up to ~0.1 ms. The rollout hot path needs several per rollout (a lease token,
a temporary file name, a placeholder no document text can contain), so instead: a keyed
BLAKE2b of a counter. The 32-byte key comes from the OS once per process (again in a forked
child); each token is a PRF output for a fresh counter value, so tokens never repeat and
cannot be predicted without the key, even by someone who has seen earlier ones.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import secrets

__all__ = ["token_bytes", "token_hex"]


def _reseed() -> None:
    global _key, _counter
    _key = secrets.token_bytes(32)
    _counter = itertools.count()


_key = b""
_counter = itertools.count()
_reseed()
os.register_at_fork(after_in_child=_reseed)


def token_bytes(size: int = 16) -> bytes:
    """``size`` (1 to 64) unguessable bytes, never the same twice in this process."""
    block = next(_counter).to_bytes(16, "big")
    return hashlib.blake2b(block, key=_key, digest_size=size).digest()


def token_hex(size: int = 16) -> str:
    """`token_bytes` as ``2 * size`` lowercase hex digits."""
    return token_bytes(size).hex()
