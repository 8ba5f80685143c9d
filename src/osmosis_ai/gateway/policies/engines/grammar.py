"""Grammars that constrain generation: one text that every engine and the learner compile.

A request's grammar (a `JsonGrammar`, or an `EbnfGrammar` such as `tagged_calls_grammar`
builds for a model's own tool-call format) is xgrammar's EBNF text (`grammar_text`). The
torch engine and vLLM both compile that text, so they enforce the same token masks; the
call record keeps it; and the trainer replays it over the recorded tokens
(`GrammarCompiler.token_masks`), so that the learner scores each token under the mask the
engine sampled it under. Without that, a token the grammar made likely (``{`` where the
model would have written prose) looks to the learner like a token the engine drew from a
different policy, and the PPO ratio of every constrained token starts far from 1.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from typing import Any

from osmosis_ai.errors import MissingExtraError, PolicyError
from osmosis_ai.gateway.policies._hf_dir import import_xgrammar
from osmosis_ai.gateway.policies.engines.base import EbnfGrammar, Grammar, JsonGrammar

__all__ = ["GrammarCompiler", "grammar_text", "stop_token_ids", "tagged_calls_grammar"]

_FEATURE = "A JSON grammar (tool calls, response_format)"


def _xgrammar() -> Any:
    """xgrammar, or a `PolicyError` naming its install command (a call fails, not the server)."""
    try:
        return import_xgrammar(_FEATURE)
    except MissingExtraError as exc:
        raise PolicyError(str(exc), status_code=500) from None


def grammar_text(grammar: Grammar) -> str:
    """The EBNF text of ``grammar`` (equal grammars give the same string object).

    Raises:
        PolicyError: xgrammar is not installed (for a `JsonGrammar`).
    """
    if isinstance(grammar, EbnfGrammar):
        return grammar.text
    return _json_text(grammar)


@functools.lru_cache(maxsize=256)
def _json_text(grammar: JsonGrammar) -> str:
    return str(_json_grammar(grammar))


@functools.lru_cache(maxsize=256)
def _json_grammar(grammar: JsonGrammar) -> Any:
    """xgrammar's grammar of ``grammar`` (cached)."""
    xgrammar = _xgrammar()
    if grammar.max_whitespace is None:
        return xgrammar.Grammar.from_json_schema(grammar.schema, any_whitespace=False)
    return xgrammar.Grammar.from_json_schema(
        grammar.schema, any_whitespace=True, max_whitespace_cnt=grammar.max_whitespace
    )


@functools.lru_cache(maxsize=256)
def tagged_calls_grammar(
    call: JsonGrammar, opening: str, closing: str, *, allow_answer: bool, max_calls: int
) -> EbnfGrammar:
    """A reply that is a plain answer (with ``allow_answer``: any text that does not start
    with ``<``, so never a half-written call) or 1 to ``max_calls`` tool calls, each
    ``opening`` + a JSON object of ``call`` + ``closing``, separated by a newline.

    Raises:
        PolicyError: xgrammar is not installed.
    """
    xgrammar = _xgrammar()
    literal = functools.partial(_literal_grammar, xgrammar)
    one = xgrammar.Grammar.concat(literal(opening), _json_grammar(call), literal(closing))
    calls = one
    for _ in range(max_calls - 1):  # nested, so the text grows linearly with max_calls
        calls = xgrammar.Grammar.union(one, xgrammar.Grammar.concat(one, literal("\n"), calls))
    if allow_answer:
        answer = xgrammar.Grammar.from_ebnf('root ::= "" | [^<] [^]*')
        calls = xgrammar.Grammar.union(answer, calls)
    return EbnfGrammar(str(calls))


def _literal_grammar(xgrammar: Any, text: str) -> Any:
    """A grammar of exactly ``text``."""
    return xgrammar.Grammar.from_ebnf(f"root ::= {json.dumps(text, ensure_ascii=False)}")


def stop_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The ids that end a completion: the tokenizer's EOS and the generation config's."""
    config = getattr(model, "generation_config", None)
    stated = getattr(config, "eos_token_id", None)
    ids = {tokenizer.eos_token_id, *(stated if isinstance(stated, list | tuple) else [stated])}
    return frozenset(i for i in ids if isinstance(i, int))


class GrammarCompiler:
    """Compiles grammar texts for one model's vocabulary (blocking; xgrammar imported on the
    first compile, and caching compiles itself).

    Args:
        tokenizer: The model's Hugging Face tokenizer.
        vocab_size: The model's vocabulary (its head's width, which may exceed the
            tokenizer's).
        stop_ids: The tokens that end a completion (allowed once the grammar is complete).
    """

    def __init__(self, tokenizer: Any, *, vocab_size: int, stop_ids: Iterable[int]) -> None:
        self.vocab_size = vocab_size
        self._tokenizer = tokenizer
        self._stop_ids = sorted(stop_ids)
        self._compiler: Any = None

    @classmethod
    def of_model(cls, model: Any, tokenizer: Any) -> GrammarCompiler:
        """The compiler of a transformers ``model`` (its vocabulary and stop tokens)."""
        return cls(
            tokenizer,
            vocab_size=model.config.vocab_size,
            stop_ids=stop_token_ids(model, tokenizer),
        )

    def compile(self, text: str) -> Any:
        """The compiled grammar of EBNF ``text``.

        Raises:
            PolicyError: xgrammar is not installed.
        """
        if self._compiler is None:
            xgrammar = _xgrammar()
            info = xgrammar.TokenizerInfo.from_huggingface(
                self._tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._stop_ids
            )
            self._compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        return self._compiler.compile_grammar(text)

    def token_masks(self, text: str, token_ids: Sequence[int]) -> tuple[Any, int]:
        """The tokens the grammar allowed before each of ``token_ids``, replayed.

        Returns an int32 tensor ``[accepted, ceil(vocab_size / 32)]`` of xgrammar bitmasks
        (row ``i``: the tokens allowed where ``token_ids[i]`` was chosen; bit ``j`` of word
        ``w`` is token ``32 w + j``) and how many tokens the grammar accepted, in order: all
        of them for a completion generated under it, fewer when a token breaks it (a grammar
        the engine did not enforce as written).
        """
        xgrammar = _xgrammar()
        matcher = xgrammar.GrammarMatcher(self.compile(text))
        masks = xgrammar.allocate_token_bitmask(max(len(token_ids), 1), self.vocab_size)
        accepted = 0
        for index, token in enumerate(token_ids):
            matcher.fill_next_token_bitmask(masks, index)
            if not matcher.accept_token(token):
                break
            accepted += 1
        return masks[:accepted], accepted
