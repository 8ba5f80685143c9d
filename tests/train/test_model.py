"""The trainer's model source: the embedded model converted once, and checked local dirs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import pytest

from osmosis_ai.errors import ConfigError, MissingExtraError
from osmosis_ai.gateway import EmbeddedPolicy, Gateway, TorchPolicy
from osmosis_ai.gateway.policies.hf_dir import load_model_dir
from osmosis_ai.train.model import EMBEDDED, embedded_model_dir, models_root, resolve_model
from tests.gateway.test_embedded_policy import CALCULATOR

REQUESTS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Name a color."}]},
    {
        "messages": [
            {"role": "system", "content": "You add numbers. Be brief."},
            {"role": "user", "content": "What is 17+25? Ünïcödé, emoji 🙂, tabs\tand\nlines."},
        ]
    },
    {"messages": [{"role": "user", "content": "What is 3*4?"}], "tools": [CALCULATOR]},
]


async def _prompt_ids(gateway: Gateway, rollout: str, request: dict[str, Any]) -> list[int]:
    headers = {"Authorization": f"Bearer {gateway.token}"}
    async with httpx2.AsyncClient(base_url=gateway.base_url, headers=headers, timeout=120) as http:
        response = await http.post(
            f"/v1/rollouts/{rollout}/chat/completions",
            json={**request, "max_tokens": 1, "temperature": 0},
        )
    assert response.status_code == 200, response.text
    (record,) = gateway.records.calls(rollout)
    return list(record.prompt_token_ids or ())


@pytest.mark.slow
async def test_embedded_model_converts_once_and_tokenizes_like_llama_cpp(tmp_path: Path) -> None:
    cache = tmp_path / "models"
    # Two concurrent callers: one converts, the other waits and reuses the result.
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda _: embedded_model_dir(cache), range(2))
    assert first == second and first.parent == cache
    assert first.name.startswith("smollm2-135m-instruct-")
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == [first.name]
    written = (first / "model.safetensors").stat().st_mtime_ns
    assert resolve_model(EMBEDDED, cache_root=cache) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == written  # not converted again

    model, tokenizer = load_model_dir(first, feature="test")
    assert model.config.vocab_size == 49152 and model.dtype.is_floating_point
    # The tokenizer ends a sequence as the model ends a turn, and a reader of its vocabulary
    # as bytes (llguidance, as vLLM's grammar backend reads it) sees the text it decodes to.
    assert tokenizer.eos_token_id == model.generation_config.eos_token_id == 2
    import llguidance.hf

    as_bytes = llguidance.hf.from_tokenizer(tokenizer)
    for text in ("<tool_call>\n{", "Ünïcödé 🙂\ttabs", ' {"a": 1}'):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert as_bytes.decode_bytes(ids) == text.encode(), text
    async with Gateway(EmbeddedPolicy()) as llama, Gateway(TorchPolicy(first)) as torch_policy:
        for index, request in enumerate(REQUESTS):
            expected = await _prompt_ids(llama, f"r{index}", request)
            assert await _prompt_ids(torch_policy, f"r{index}", request) == expected


def test_models_are_cached_under_the_home_directory() -> None:
    assert models_root() == Path.home() / ".osmosis" / "models"


def test_a_local_directory_resolves_to_itself(tiny_model_dir: Path) -> None:
    assert resolve_model(str(tiny_model_dir)) == tiny_model_dir.resolve()


@pytest.mark.parametrize(
    ("removed", "named"),
    [
        ("model.safetensors", "weights: model.safetensors or pytorch_model.bin"),
        ("tokenizer.json", "a tokenizer: tokenizer.json or tokenizer.model"),
        ("config.json", "config.json"),
    ],
)
def test_a_directory_missing_a_part_names_it_and_the_fix(
    tiny_model_dir: Path, tmp_path: Path, removed: str, named: str
) -> None:
    broken = shutil.copytree(tiny_model_dir, tmp_path / "broken")
    (broken / removed).unlink()
    with pytest.raises(ConfigError) as info:
        resolve_model(broken)
    message = str(info.value)
    assert named in message and "save_pretrained(dir)" in message and str(broken) in message


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_model(tmp_path / "nowhere")


def test_missing_torch_names_the_train_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'osmosis-ai\[train\]'"):
        embedded_model_dir(tmp_path / "models")  # an empty cache: converting needs torch


def test_importing_the_model_source_and_policy_loads_no_torch() -> None:
    code = (
        "import sys, osmosis_ai.train.model, osmosis_ai.gateway.policies.torch\n"
        "heavy = {'torch', 'transformers', 'llguidance'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ.copy(), timeout=60)
