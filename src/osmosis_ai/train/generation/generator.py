"""What generates a training run's rollouts (``[engine]``): the torch engine on the
learner's own model object, or a vLLM server that gets the weights after every step."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from osmosis_ai.gateway.policies.engines.base import TokenEngine
from osmosis_ai.gateway.policies.engines.torch import TorchEngine
from osmosis_ai.gateway.policies.engines.vllm import VllmEngine
from osmosis_ai.gateway.policies.torch_device import update_in_bf16
from osmosis_ai.train.config import TrainConfig
from osmosis_ai.train.generation.vllm_server import VllmServer
from osmosis_ai.train.learner.core import Learner

__all__ = ["Generator", "engine_in_bf16", "open_generator", "weights_directory"]

#: A tmpfs for the weights vLLM reloads each step, when it has room for them twice over.
_SHM = Path("/dev/shm")
#: How long a server that refuses connections is given to be seen exiting.
_EXIT_WAIT_SEC = 10.0


@dataclass
class Generator:
    """The run's token engine and, for vLLM, the server it talks to."""

    engine: TokenEngine
    server: VllmServer | None = None

    @property
    def on_learner_thread(self) -> bool:
        """Whether the engine generates on the learner's own thread (the torch engine)."""
        return self.server is None

    @property
    def lost(self) -> bool:
        """Whether the engine's server exited or stopped answering."""
        return self.engine.unreachable is not None or (
            self.server is not None and self.server.exited
        )

    async def died(self) -> None:
        """Wait until a managed engine server exits (never, for the torch engine or an
        attached server)."""
        if self.server is None:
            await asyncio.Event().wait()
        assert self.server is not None
        await self.server.wait()

    async def why_lost(self) -> str:
        """Why the engine is lost: a managed server's exit status and last error (waiting
        briefly for the exit of one that refuses connections), else the failed call."""
        server = self.server
        if server is not None and server.managed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait(), _EXIT_WAIT_SEC)
            if server.exited:
                await server.drain_output()
                status = server.returncode
                return f"the vLLM server exited with status {status}: {server.last_error()}"
        return self.engine.unreachable or "the engine stopped"


@contextlib.asynccontextmanager
async def open_generator(
    config: TrainConfig,
    learner: Learner,
    *,
    base_dir: Path,
    run_dir: Path,
    version: int,
    log: logging.Logger,
    redact: Callable[[str], str],
    say: Callable[[str], None],
) -> AsyncIterator[Generator]:
    """The run's engine, started; a vLLM server is started (or attached to) first, loaded
    with the learner's weights when they are not the base model's, and stopped after.

    Raises:
        VllmServerError: The vLLM server could not be started or attached to.
        VllmEngineError: It did not take the learner's weights.
    """
    training, vllm_config = config.training, config.engine.vllm
    rank = config.learner.lora.rank if config.learner.lora is not None else 0
    if vllm_config is None:  # the torch engine: the policy serving it starts and stops it
        bf16 = engine_in_bf16(config, learner)
        engine = TorchEngine(
            learner.served_model,
            learner.tokenizer,
            version=version,
            max_batch_size=config.engine.max_batch_size,
            prefix_cache=config.engine.prefix_cache,
            precision="bf16" if bf16 else "fp32",
            thread=learner.thread,
        )
        yield Generator(engine)
        return
    # The adapters of the versions rollouts in flight may still use, and the one loading.
    keep_adapters = max(2, training.max_staleness + 1)
    server = VllmServer(
        vllm_config,
        base_dir,
        lora_rank=rank,
        max_loras=keep_adapters + 1,
        sequences=training.rollouts_in_flight,
        log=lambda line: log.info("%s", line, extra={"step": "vllm"}),
        redact=redact,
    )
    weights = weights_directory(run_dir, _model_bytes(learner))
    try:
        say(f"starting the vLLM server ({vllm_config.python})" if server.managed else
            f"attaching to the vLLM server at {server.url}")  # fmt: skip
        await server.start()
        vllm = VllmEngine(
            server.url,
            weights_dir=weights,
            version=version,
            weights_dtype=vllm_config.dtype,
            executor=learner.thread,
            lora=bool(rank),
            keep_adapters=keep_adapters,
        )
        vllm.model_name = server.served_model
        await vllm.start()
        try:
            if version or rank or not server.managed:
                # A resumed run, an adapter to name, or a server of unknown weights.
                async with vllm.updating(version=version) as update:
                    await update.push(learner.model)
            yield Generator(vllm, server)
        finally:
            await vllm.aclose()
    finally:
        await server.stop()
        await asyncio.to_thread(shutil.rmtree, weights, True)


def engine_in_bf16(config: TrainConfig, learner: Learner) -> bool:
    """Whether the torch engine generates from a bf16 copy: ``[engine] precision``, whose
    ``auto`` follows the learner's resolved precision (bf16 where the device computes it
    natively, unless ``[learner] precision = "fp32"`` asked for exact logprobs).

    Raises:
        ConfigError: ``"bf16"`` where the device would emulate it.
    """
    precision = config.engine.precision
    if precision == "auto":
        return learner.settings.bf16
    return update_in_bf16(learner.device, precision, key="[engine] precision")


def weights_directory(run_dir: Path, model_bytes: int) -> Path:
    """A new directory for the weights pushed to vLLM: on the tmpfs ``/dev/shm`` when it has
    room for twice ``model_bytes``, else in the run directory."""
    with contextlib.suppress(OSError):
        if shutil.disk_usage(_SHM).free > 2 * model_bytes:
            return Path(tempfile.mkdtemp(prefix="osmosis-vllm-weights-", dir=_SHM))
    directory = run_dir / "vllm-weights"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _model_bytes(learner: Learner) -> int:
    return sum(p.numel() * p.element_size() for p in learner.served_model.parameters())
