"""On-policy distillation through ``osmosis train run`` (in this process; tiny random models
with the embedded tokenizer): a teacher that differs from the student trains two steps even
where every reward is equal, a teacher equal to the student measures a reverse KL of 0 at the
first step (its logprobs line up with the student's, token for token), and a teacher with
another tokenizer is refused."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.testing import ChatStub
from tests.train.conftest import save_tiny_model
from tests.train.training_project import lines, train_here, workspace, write_rows

pytestmark = [pytest.mark.slow, pytest.mark.whole_run]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    """Another tiny random Llama (another seed) with the student's tokenizer."""
    return save_tiny_model(tmp_path_factory.mktemp("teacher"), tokenizer_dir, seed=1)


def _config(tmp_path: Path, student: Path, teacher: Path | str, settings: str = "") -> Path:
    config = workspace(
        tmp_path / "ws",
        student,
        'steps = 2\n[learner]\nprecision = "fp32"\n'
        f'[algorithm.distill]\nteacher = "{teacher}"\n{settings}',
    )
    # Every reward is 1: without the teacher no group would carry a gradient.
    write_rows(tmp_path / "ws", metadata={"reward": 1.0})
    return config


async def test_a_teacher_trains_two_steps_where_the_rewards_alone_would_not(
    tmp_path: Path, tiny_model_dir: Path, teacher_dir: Path
) -> None:
    outcome = await train_here(_config(tmp_path, tiny_model_dir, teacher_dir))
    assert outcome.steps_done == 2
    metrics = lines(tmp_path / "ws" / ".osmosis" / "train" / "tiny" / "metrics.jsonl")
    for line in metrics:
        assert line["zero_gradient_groups"] == 0 and line["updates"] == 1, line
        assert line["tokens_trained"] > 0 and line["loss"] is not None
        # Two random models: the teacher's logprobs are not the student's, so every token has
        # an advantage and the gradient is not 0 (0.44-0.47 measured; a teacher equal to the
        # student gives 7e-7, below). The reverse KL is a signed mean over a few dozen tokens
        # of two near-uniform models: either sign, and near 0 by chance (1e-4 in a CI run).
        assert math.isfinite(line["teacher_reverse_kl"]) and line["grad_norm"] > 1e-2, line
        assert line["teacher_sec"] > 0


async def test_a_teacher_equal_to_the_student_is_at_a_reverse_kl_of_zero_before_it_moves(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """At step 1 the student is its initial weights, which the teacher holds too: every
    sampled token's two logprobs agree (fp32, the same distribution), so the teacher scores
    each token at its own position. After an update the student has moved away."""
    await train_here(_config(tmp_path, tiny_model_dir, tiny_model_dir))
    first, second = lines(tmp_path / "ws" / ".osmosis" / "train" / "tiny" / "metrics.jsonl")
    assert abs(first["teacher_reverse_kl"]) < 1e-5, first
    assert first["loss"] is not None and abs(first["loss"]) < 1e-5, first
    assert first["grad_norm"] < 1e-4, first  # no gap, no gradient (7e-7 measured)
    # Moved: the gaps give a gradient again (0.06 measured; the signed mean gap is 8e-4).
    assert second["grad_norm"] > 1e-3, second


async def test_a_teacher_with_another_tokenizer_is_refused_in_one_line(
    tmp_path: Path, tiny_model_dir: Path, teacher_dir: Path
) -> None:
    from transformers import AutoTokenizer

    other = tmp_path / "other-teacher"
    save_tiny_model(other, teacher_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(other), local_files_only=True)
    tokenizer.add_tokens(["<made-up-token>"])
    tokenizer.save_pretrained(str(other))
    with pytest.raises(ConfigError) as refused:
        await train_here(_config(tmp_path, tiny_model_dir, other))
    message = str(refused.value)
    assert message.startswith("algorithm.distill.teacher ") and "\n" not in message
    assert "its tokenizer is not the student's (vocabularies of 49153 and 49152 tokens" in message


def _scorer(model_dir: Path) -> Callable[[list[int]], list[float]]:
    """What a vLLM server of ``model_dir`` answers as prompt logprobs: each token's logprob
    under the unscaled distribution of its prefix (0.0 for the first)."""
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    model.train(False)

    def score(ids: list[int]) -> list[float]:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].float()
        picked = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(ids[1:])[:, None])
        return [0.0, *picked[:, 0].tolist()]

    return score


async def test_a_teacher_server_scores_each_token_in_place(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A vLLM-style server (a stub answering prompt logprobs from the student's own initial
    weights) as the teacher: at temperature 1 its logprobs of the first step's tokens are the
    student's behaviour logprobs, so the reverse KL is 0 there, and the run trains."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir), local_files_only=True)
    async with ChatStub(
        encode=lambda text: tokenizer.encode(text, add_special_tokens=False),
        prompt_logprobs=_scorer(tiny_model_dir),
    ) as server:
        teacher = f"openai:{server.base_url}:teacher"
        config = _config(tmp_path, tiny_model_dir, teacher, "[sampling]\ntemperature = 1.0\n")
        outcome = await train_here(config)
    assert outcome.steps_done == 2
    first, _ = lines(tmp_path / "ws" / ".osmosis" / "train" / "tiny" / "metrics.jsonl")
    assert abs(first["teacher_reverse_kl"]) < 1e-4, first
    scored = [r["body"] for r in server.requests if "prompt_logprobs" in r["body"]]
    assert scored and all(b["max_tokens"] == 1 and b["model"] == "teacher" for b in scored)


async def test_a_teacher_server_with_another_tokenizer_is_refused(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    async with ChatStub(encode=lambda text: [1, 2, 3]) as server:
        url = server.base_url
        config = _config(tmp_path, tiny_model_dir, f"openai:{url}")
        with pytest.raises(ConfigError) as refused:
            await train_here(config)
    assert str(refused.value).startswith(
        f"algorithm.distill.teacher {url}: its tokenizer is not the student's (a probe text is "
        "3 tokens there"
    )
