"""The weight probe against a real torch engine that holds its own copy of the weights: a
push that copies them passes, a push that does nothing is one clear stop (full and LoRA)."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from osmosis_ai.errors import PolicyError
from osmosis_ai.gateway.policies.engines.torch import TorchEngine
from osmosis_ai.train.config import load_train_config
from osmosis_ai.train.generation.probe import WeightProbe
from osmosis_ai.train.learner.core import Learner
from osmosis_ai.train.loop.outcome import TrainingStopped
from tests.train.training_project import workspace


def _lora(rank: int) -> str:
    return f"[learner.lora]\nrank = {rank}" if rank else ""


@pytest_asyncio.fixture(params=[0, 4], ids=["full", "lora"])
async def learner(
    request: pytest.FixtureRequest, tmp_path: Path, tiny_model_dir: Path
) -> AsyncIterator[Learner]:
    config = load_train_config(workspace(tmp_path / "ws", tiny_model_dir, _lora(request.param)))
    learner = await Learner.load(config, tiny_model_dir, tiny_model_dir, torch.device("cpu"))
    try:
        yield learner
    finally:
        learner.close()


@pytest_asyncio.fixture
async def engine(learner: Learner) -> AsyncIterator[TorchEngine]:
    """A torch engine on a copy of the learner's served model (as a separate generator
    holds its own weights), on its own thread."""
    engine = TorchEngine(copy.deepcopy(learner.served_model), learner.tokenizer, version=0)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.aclose()


def _change_the_trained_weights(learner: Learner) -> None:
    """As an update would: every trainable weight moves (under LoRA, the adapter's)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in learner.model.parameters():
            if parameter.requires_grad:
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))


async def test_the_probe_passes_when_the_engine_got_the_weights(
    learner: Learner, engine: TorchEngine
) -> None:
    probe = WeightProbe(engine, learner)
    _change_the_trained_weights(learner)
    async with engine.updating(version=1) as update:
        await update.push(learner.model)
    assert 0 <= await probe.check(1) <= 1e-3


async def test_the_probe_stops_the_run_when_a_push_did_not_reach_the_engine(
    learner: Learner, engine: TorchEngine
) -> None:
    probe = WeightProbe(engine, learner)
    _change_the_trained_weights(learner)
    async with engine.updating(version=1):
        pass  # a broken push: the version moves on, the weights do not
    with pytest.raises(
        TrainingStopped, match="not generating with the learner.s weights"
    ) as caught:
        await probe.check(1)
    assert "step 1" in str(caught.value) and "torch engine" in str(caught.value)


async def test_a_bf16_engine_generates_from_its_own_copy_and_the_probe_allows_its_gap(
    learner: Learner,
) -> None:
    """``[engine] precision = "bf16"``: the engine copies the served model in bf16 and takes
    every push into the copy; its probe tolerance is calibrated as a server's, and a push
    that did not arrive fails the probe's call (the copy's weights were released for the
    update), which the step turns into a stop."""
    engine = TorchEngine(learner.served_model, learner.tokenizer, precision="bf16")
    await engine.start()
    try:
        assert engine.model is not learner.served_model
        assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
        probe = WeightProbe(engine, learner)
        assert await probe.calibrate(0) <= 0.2
        assert probe.tolerance >= 0.05
        _change_the_trained_weights(learner)
        async with engine.updating(version=1) as update:
            await update.push(learner.model)
        assert await probe.check(1) <= probe.tolerance
        _change_the_trained_weights(learner)
        async with engine.updating(version=2):
            pass
        with pytest.raises(PolicyError, match="no weights: an update released"):
            await probe.check(2)
    finally:
        await engine.aclose()
