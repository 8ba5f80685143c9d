"""PieceTokenizer: the tokenizer's own ids, encoding only text it has not seen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.gateway.policies._prompt_tokens import PieceTokenizer
from tests.train.conftest import tokenizer_dir  # noqa: F401 -- fixture

CONVERSATION = [
    {"role": "system", "content": "You are a careful calculator."},
    {"role": "user", "content": "What is 22 + 6?  \n"},
    {"role": "assistant", "content": "It is 28. é漢字 🙂"},
    {"role": "user", "content": "A literal <|im_end|> inside, then\n\n  spaces  "},
]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Any:  # noqa: F811
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


def _own_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_pieces_give_the_tokenizers_own_ids(tokenizer: Any) -> None:
    pieces = PieceTokenizer.of(tokenizer)
    assert pieces is not None
    texts = [
        "",
        "plain text",
        "<|im_end|><|im_end|>x<|im_start|",
        "  <|im_start|>  padded  <|im_end|>  ",
    ]
    # A growing conversation, as an agent's calls resend it: later prompts hit the cache.
    for turns in range(1, len(CONVERSATION) + 1):
        texts.append(
            tokenizer.apply_chat_template(
                CONVERSATION[:turns], add_generation_prompt=True, tokenize=False
            )
        )
    for text in texts * 2:
        assert pieces.encode(text) == _own_ids(tokenizer, text), text


def test_encode_if_known_encodes_only_within_the_new_text_allowed(tokenizer: Any) -> None:
    pieces = PieceTokenizer.of(tokenizer)
    assert pieces is not None

    def new_chars(text: str) -> int:
        """The least allowance for which the text is encoded (nothing is cached meanwhile)."""
        allowance = next(n for n in range(len(text) + 1) if pieces.encode_if_known(text, n))
        assert pieces.encode_if_known(text, allowance) == _own_ids(tokenizer, text)
        return allowance

    first = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert pieces.encode_if_known(first, 0) is None
    assert pieces.encode_if_known(first, 1) is None  # refused before encoding anything
    assert new_chars(first) == len("user\nWhat is 2+2?") + len("\n") + len("assistant\n")
    assert new_chars(first) == 0
    # The next call resends the conversation with an answer and a question added.
    following = first + "It is 4.<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
    assert pieces.encode_if_known(following, 0) is None
    assert new_chars(following) == len("assistant\nIt is 4.") + len("user\nAnd 3+3?")
    assert new_chars(following) == 0


def test_the_piece_cache_stays_within_its_bound(tokenizer: Any) -> None:
    bounded = PieceTokenizer.of(tokenizer)
    assert bounded is not None
    bounded.max_cached_chars = 200
    texts = [f"<|im_start|>user\nmessage {i} {'x' * i}<|im_end|>\n" for i in range(60)]
    texts.append("<|im_start|>" + "long " * 100)  # longer than the whole cache: not kept
    for text in texts * 2:
        assert bounded.encode(text) == _own_ids(tokenizer, text)
        assert 0 < bounded.cached_chars <= 200


def test_tokenizers_where_pieces_could_differ_are_not_offered_one(
    tokenizer_dir: Path,  # noqa: F811
) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    # An added token that strips the space before it: " x <tool>" is not " x " + "<tool>".
    stripping = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    stripping.add_tokens([AddedToken("<tool>", lstrip=True)])
    assert PieceTokenizer.of(stripping) is None
    added = {
        token.content: index
        for index, token in stripping.backend_tokenizer.get_added_tokens_decoder().items()
    }
    unchecked = PieceTokenizer(stripping.backend_tokenizer, added)
    assert unchecked.encode(" x <tool>") != _own_ids(stripping, " x <tool>")

    # Metaspace marks only the input's first piece: "a<s>a" is "▁a", "<s>", "a".
    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "▁a": 1, "a": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    backend.add_special_tokens(["<s>"])
    positional: Any = PreTrainedTokenizerFast(tokenizer_object=backend)  # type: ignore[no-untyped-call]
    assert PieceTokenizer.of(positional) is None
    unchecked = PieceTokenizer(positional.backend_tokenizer, {"<s>": 3})
    assert unchecked.encode("a<s>a") != _own_ids(positional, "a<s>a")
