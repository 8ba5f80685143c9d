"""The weight probe: after every weight push, the engine and the learner score the same few
tokens after a fixed prompt; the two must agree.

An engine that did not receive the new weights (a reload that silently failed, a LoRA adapter
loaded but never called, a server still serving the base model) goes on generating, and a
run trains on data from a policy it does not know about; its logprobs then differ from the
learner's by the step's whole change. The probe turns that into one clear stop, the step
after it happens. The engine generates the probe's tokens (a continuation of the prompt
sampled with a fixed seed) and the learner scores them. An engine that can score tokens
(`TokenEngine.can_score`: the torch engine) generates them once, at the first probe, and
then scores them in one prefill (`TokenEngine.score`), a fraction of generating them one
decoding step at a time (on a 2-core CPU and the embedded model about 0.05 s against 0.77
s in bf16, `benchmarks/probe.py`); a vLLM server generates them at every probe. The gap is
the median |engine - learner| logprob of the probe's tokens (a stale engine moves every
token; one rare token scored a little apart does not stop a run); the
tolerance is the engine's: the torch engine in fp32 generates with the learner's own weights
(``1e-3``); a vLLM server, or the torch engine's bf16 copy, holds them in its own dtype, so
its tolerance is four times the gap measured before the first step (when both hold the same
weights, a gap of at most 0.2), and at least 0.05.
"""

from __future__ import annotations

import statistics

from osmosis_ai.gateway.policies.engines.base import GenerationRequest, Sampling, TokenEngine
from osmosis_ai.gateway.policies.engines.torch import TorchEngine
from osmosis_ai.train.learner.core import Learner
from osmosis_ai.train.loop.outcome import TrainingStopped

__all__ = ["PROBE_SEED", "PROBE_TEXT", "PROBE_TOKENS", "WeightProbe", "probe_tolerance"]

#: The probe's prompt: plain text, which any tokenizer encodes (no chat template needed).
PROBE_TEXT = "The weather report for the coast this weekend says that"
#: How many tokens the probe compares, and the seed they are sampled with.
PROBE_TOKENS = 16
PROBE_SEED = 1234
#: The torch engine's tolerance: the learner's own weights, in the same precision.
_EXACT = 1e-3
#: A server's tolerance is this many times its gap before the first step, and at least
#: ``_SERVER_FLOOR``.
_SERVER_MARGIN = 4.0
_SERVER_FLOOR = 0.05
#: A server whose gap is over this before the first step does not hold the learner's weights.
_SERVER_CEILING = 0.2


def probe_tolerance(engine: TokenEngine, baseline: float) -> float:
    """The median logprob gap the probe accepts from ``engine``, whose gap was ``baseline``
    when it held the learner's weights."""
    if _exact(engine):
        return _EXACT
    return max(_SERVER_FLOOR, _SERVER_MARGIN * baseline)


def _exact(engine: TokenEngine) -> bool:
    """Whether ``engine`` generates with the learner's own weights (the torch engine in
    fp32), not a copy in another dtype."""
    return isinstance(engine, TorchEngine) and engine.precision == "fp32"


class WeightProbe:
    """Checks that ``engine`` generates with ``learner``'s current weights."""

    def __init__(self, engine: TokenEngine, learner: Learner) -> None:
        self._engine, self._learner = engine, learner
        self.tolerance = probe_tolerance(engine, 0.0)
        self.prompt_ids = [int(i) for i in learner.tokenizer(PROBE_TEXT)["input_ids"]]
        self.token_ids: list[int] | None = None
        """The tokens an engine that can score scores, generated at the first probe."""

    async def calibrate(self, version: int) -> float:
        """The probe before the first step, while engine and learner hold the same weights
        (``version``): sets a server's tolerance from its gap; returns the gap.

        Raises:
            TrainingStopped: The engine does not hold the learner's weights.
            PolicyError: The engine failed the probe's calls.
        """
        if not _exact(self._engine):
            self.tolerance = _SERVER_CEILING
        gap = await self._gap(version, f"before step {version + 1}")
        self.tolerance = probe_tolerance(self._engine, gap)
        return gap

    async def check(self, step: int) -> float:
        """The probe after step ``step``'s weights were pushed; returns the median logprob gap.

        Raises:
            TrainingStopped: The engine's logprobs are not the learner's (it does not serve
                the weights of step ``step``).
            PolicyError: The engine failed the probe's call.
        """
        return await self._gap(step, f"after step {step}'s weights were pushed")

    async def _gap(self, version: int, when: str) -> float:
        tokens, logprobs, engines_version = await self._engine_logprobs()
        if not tokens:  # the engine's first token ended the generation
            return 0.0
        learner = self._learner
        scored = await learner.run(_learner_logprobs, learner, self.prompt_ids, tokens)
        gap = statistics.median(abs(a - b) for a, b in zip(logprobs, scored, strict=True))
        if engines_version != version or gap > self.tolerance:
            raise TrainingStopped(
                f"{when}, the {self._engine.kind} engine's logprobs of a probe prompt differ "
                f"from the learner's by {gap:.3g} (median; at most {self.tolerance:.3g} "
                f"expected; the engine says version {engines_version}): it is not "
                f"generating with the learner's weights"
            )
        return round(gap, 6)

    async def _engine_logprobs(self) -> tuple[list[int], list[float], int]:
        """The probe's tokens, the engine's logprobs of them and its weight version."""
        engine = self._engine
        if self.token_ids is None or not engine.can_score:
            sampling = Sampling(temperature=1.0, max_tokens=PROBE_TOKENS, seed=PROBE_SEED)
            generation = await engine.generate(GenerationRequest(self.prompt_ids, sampling))
            if not engine.can_score:
                return generation.token_ids, generation.logprobs, generation.version
            self.token_ids = list(generation.token_ids)
        scores = await engine.score(self.prompt_ids, self.token_ids)
        return self.token_ids, scores.logprobs, scores.version


def _learner_logprobs(learner: Learner, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
    """The learner's logprobs of the probe's tokens, as the update scores tokens
    (fp32, temperature 1; blocking, on the learner's thread)."""
    import torch

    from osmosis_ai.train.algorithm.logprobs import policy_logprobs
    from osmosis_ai.train.algorithm.micro_batches import collate
    from osmosis_ai.train.algorithm.sequences import TrainingSequence

    sequence = TrainingSequence(
        rollout_id="probe",
        group_id="probe",
        reward=0.0,
        token_ids=(*prompt_ids, *token_ids),
        loss_mask=(0,) * len(prompt_ids) + (1,) * len(token_ids),
        behaviour_logprobs=(0.0,) * (len(prompt_ids) + len(token_ids)),
    )
    learner.model.train(False)
    batch = collate([sequence], [0.0], [1.0]).to(learner.device)
    with torch.no_grad():
        values = policy_logprobs(learner.model, batch)
    return [float(x) for x in values[batch.loss_mask > 0].cpu()]
