"""Tokens without a system call each (`osmosis_ai._unique`)."""

from __future__ import annotations

import os

from osmosis_ai._unique import token_bytes, token_hex


def test_tokens_have_the_asked_size_and_never_repeat() -> None:
    tokens = [token_hex(8) for _ in range(10_000)]
    assert all(len(token) == 16 and int(token, 16) >= 0 for token in tokens)
    assert len(set(tokens)) == len(tokens)
    assert len(token_bytes(32)) == 32


def test_a_forked_child_draws_tokens_of_its_own() -> None:
    # Without a new key after fork, parent and child would produce the same next tokens.
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next token and leave at once
        os.write(write, token_hex().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        child_token = pipe.read()
    assert len(child_token) == 32
    assert child_token != token_hex()
