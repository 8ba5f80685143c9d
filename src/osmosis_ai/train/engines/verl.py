"""verl adapter: an AgentWorkflow and its Grader as the agent loop of a verl training run.

``OsmosisAgentLoop`` is registered as ``osmosis`` (or named in an ``agent_loop_config_path``
YAML). verl instantiates it once per sample; the first ``run`` of a worker starts the shared
``AgentRollouts`` (a gateway whose policy, ``VerlServerPolicy``, generates through the
worker's ``server_manager``, and the backend the workflow runs on). Each ``run`` executes
one rollout and returns one ``AgentLoopOutput``: the rollout's calls realigned into one
token sequence (``AgentRollouts(one_sequence=True)``), the Grader's reward as
``reward_score`` (so verl's own reward loop is skipped).

A rollout that fails, times out or is removed (``remove_sample``) still gives verl its one
row, as verl needs, but one that trains nothing: its response mask is all 0, its reward
0.0, and ``extra_fields["osmosis_excluded"]`` says why. verl has no per-sample drop in its
PPO/GRPO step and scores a batch only when every row has a score; its own ``grpo`` would
count the 0.0 in the group's mean and std, so train with ``algorithm.adv_estimator=
osmosis_grpo`` (or ``osmosis_rloo``, ``verl_advantage``), which leave such rows out of
their group as ``osmosis train`` does. The loop warns once when it sees one under another
estimator.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.records import CallRecord
from osmosis_ai.train.engines._core import AgentRollouts, EngineRollout, EngineTask
from osmosis_ai.train.engines.verl_advantage import ESTIMATORS
from osmosis_ai.train.engines.verl_policy import FEATURE, VerlServerPolicy

__all__ = ["SETTINGS", "OsmosisAgentLoop", "close_shared_rollouts", "engine_task", "verl_row"]

# Without verl: a MissingExtraError naming the extra, not a bare ModuleNotFoundError.
import_optional("verl.experimental.agent_loop.agent_loop", extra="verl", feature=FEATURE)
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

#: The agent loop's settings (keys of its ``agent_loop_config_path`` entry, or of the
#: trainer config's ``osmosis`` section), passed to ``AgentRollouts`` unless noted.
SETTINGS = frozenset(
    {
        "workflow", "grader", "workflow_config", "grader_config", "backend", "server_url",
        "server_api_key", "agent_timeout_sec", "grader_timeout_sec", "max_in_flight",
        "rollout_deadline_sec", "gateway_host",
        "tool_parser",  # VerlServerPolicy's
    }
)  # fmt: skip
# What verl itself passes to every agent loop besides its documented arguments.
_VERL_KWARGS = frozenset({"name", "tools"})

logger = logging.getLogger(__name__)
#: Whether this process already warned that an excluded rollout enters verl's estimator.
_warned_estimator = False


@dataclass(frozen=True, slots=True)
class _Shared:
    rollouts: AgentRollouts
    policy: VerlServerPolicy
    pad_id: int


# Per worker (event loop), server manager and settings: verl builds the loop per sample.
_SHARED: dict[tuple[int, int, str], asyncio.Task[_Shared]] = {}


async def close_shared_rollouts() -> None:
    """Stop the shared rollouts started on the running event loop (worker shutdown, tests)."""
    loop_id = id(asyncio.get_running_loop())
    for key in [key for key in _SHARED if key[0] == loop_id]:
        starting = _SHARED.pop(key)
        if starting.done() and starting.exception() is None:
            await starting.result().rollouts.__aexit__(None, None, None)


class OsmosisAgentLoop(AgentLoopBase):  # type: ignore[misc]  # verl is untyped
    """Runs one AgentWorkflow rollout per verl sample.

    The dataset row gives ``raw_prompt`` (the messages), ``reward_model["ground_truth"]``
    (the label, given only to the Grader) and ``extra_info`` (the metadata); ``uid`` (the
    prompt group) joins the rollout id.

    Settings (``SETTINGS``) come from the ``agent_loop_config_path`` entry and override
    the trainer config's ``osmosis`` section. ``workflow`` (``"module:Class"``) is required.

    Raises:
        ConfigError: An unknown setting or no workflow (the message lists the settings).
    """

    def __init__(
        self,
        trainer_config: Any,
        server_manager: Any,
        tokenizer: Any,
        processor: Any,
        dataset_cls: Any,
        data_config: Any,
        hf_model_type: str | None = None,
        **kwargs: Any,
    ) -> None:
        settings = {key: kwargs.pop(key) for key in list(kwargs) if key in SETTINGS}
        unknown = sorted(set(kwargs) - _VERL_KWARGS)
        if unknown:
            raise ConfigError(
                f"unknown osmosis agent loop setting(s) {unknown}; it takes: "
                f"{', '.join(sorted(SETTINGS))}"
            )
        super().__init__(
            trainer_config,
            server_manager,
            tokenizer,
            processor,
            dataset_cls,
            data_config,
            hf_model_type=hf_model_type,
            **kwargs,
        )
        self.settings = _settings(self.config.get("osmosis"), settings)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        """Run the row's rollout; one ``AgentLoopOutput`` for its trajectory."""
        task = engine_task(kwargs)  # a bad row fails before anything starts
        shared = await self._shared()
        started = time.time()
        with shared.policy.rollout_sampling(task.rollout_id, sampling_params):
            (rollout,) = await shared.rollouts.run([task])
        fallback = None
        if _first_prompt(rollout.calls) is None:  # failed before any model call
            fallback = await asyncio.to_thread(shared.policy.prompt_ids, task.prompt, [])
        row = verl_row(
            rollout,
            prompt_length=int(self.rollout_config.prompt_length),
            response_length=int(self.rollout_config.response_length),
            fallback_prompt_ids=fallback,
            pad_id=shared.pad_id,
        )
        if rollout.excluded is not None:
            self._warn_estimator(rollout)
        return AgentLoopOutput(**row, metrics=AgentLoopMetrics(**_timings(rollout, started)))

    def _warn_estimator(self, rollout: EngineRollout) -> None:
        """Once per process: an excluded rollout's 0.0 would enter an estimator not ours."""
        global _warned_estimator
        algorithm = self.config.get("algorithm") or {}
        estimator = str(algorithm.get("adv_estimator") or "")
        if _warned_estimator or not estimator or estimator in ESTIMATORS:
            return
        _warned_estimator = True
        excluded = rollout.excluded.value if rollout.excluded else "?"
        logger.warning(
            "rollout %s trains nothing (%s): verl gets it as a row with reward 0.0, which "
            "algorithm.adv_estimator=%s may count in its group's statistics (grpo and rloo "
            "do); osmosis_grpo or osmosis_rloo leave it out, as osmosis train does",
            rollout.task.rollout_id,
            excluded,
            estimator,
        )

    async def _shared(self) -> _Shared:
        # The policy's completion cap is the trainer's response length: part of the key.
        described = {**self.settings, "response_length": self.rollout_config.response_length}
        key = (
            id(asyncio.get_running_loop()),
            id(self.server_manager),
            json.dumps(described, sort_keys=True, default=str),
        )
        starting = _SHARED.get(key)
        if starting is None or (starting.done() and starting.exception() is not None):
            starting = asyncio.ensure_future(self._start())
            _SHARED[key] = starting
        return await asyncio.shield(starting)

    async def _start(self) -> _Shared:
        settings = dict(self.settings)
        policy = VerlServerPolicy(
            self.server_manager,
            self.tokenizer,
            tool_parser=settings.pop("tool_parser", "hermes"),
            max_tokens=int(self.rollout_config.response_length),
            chat_template_kwargs=_plain(self.apply_chat_template_kwargs) or None,
        )
        workflow = settings.pop("workflow", None)
        rollouts = AgentRollouts(
            workflow, policy=policy, drift="realign", one_sequence=True, **settings
        )
        await rollouts.__aenter__()
        return _Shared(rollouts, policy, _pad_id(self.tokenizer))


register("osmosis")(OsmosisAgentLoop)


def _settings(section: object, given: Mapping[str, Any]) -> dict[str, Any]:
    merged = {**(_plain(section) or {}), **{key: _plain(value) for key, value in given.items()}}
    unknown = sorted(set(merged) - SETTINGS)
    if unknown:
        raise ConfigError(
            f"unknown osmosis setting(s) {unknown} in the trainer config's 'osmosis' section; "
            f"it takes: {', '.join(sorted(SETTINGS))}"
        )
    if not merged.get("workflow") and not merged.get("server_url"):
        raise ConfigError(
            "the osmosis agent loop needs 'workflow' (\"module:Class\" of your AgentWorkflow) "
            "or 'server_url' (a rollout server): set it in the agent_loop_config_path entry "
            "or as +osmosis.workflow=... on the trainer's command line"
        )
    return merged


def _plain(value: object) -> Any:
    """OmegaConf containers (what hydra passes) as plain dicts and lists."""
    if hasattr(value, "_metadata"):  # an OmegaConf DictConfig / ListConfig
        omegaconf = import_optional("omegaconf", extra="verl", feature=FEATURE)
        return omegaconf.OmegaConf.to_container(value, resolve=True)
    return value


def engine_task(row: Mapping[str, Any]) -> EngineTask:
    """The rollout a verl dataset row asks for (``raw_prompt``, ``reward_model``,
    ``extra_info``, ``uid``/``index``).

    Raises:
        ConfigError: ``raw_prompt`` is missing or not a list of messages.
    """
    raw = row.get("raw_prompt")
    # verl hands object columns as numpy arrays: a row's messages may be an ndarray.
    listed: list[Any] = []
    if isinstance(raw, list | tuple) or type(raw).__name__ == "ndarray":
        listed = list(raw)  # type: ignore[arg-type]  # an ndarray iterates
    messages = [dict(m) for m in listed if isinstance(m, Mapping)]
    if (
        not messages
        or len(messages) != len(listed)
        or not all(isinstance(m.get("role"), str) for m in messages)
    ):
        raise ConfigError(
            "verl row field 'raw_prompt' must be a list of chat messages "
            "({'role': ..., 'content': ...}); build the dataset with a 'prompt' column of messages"
        )
    reward_model = row.get("reward_model")
    truth = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None
    extra_info = row.get("extra_info")
    group = str(row.get("uid") or row.get("index") or "row")
    return EngineTask(
        rollout_id=f"{group}-{uuid.uuid4().hex[:12]}".replace("/", "_"),
        group_id=group,
        prompt=messages,
        label=None if truth is None else str(truth),
        metadata=dict(extra_info) if isinstance(extra_info, Mapping) else None,
    )


def _pad_id(tokenizer: Any) -> int:
    for token in (tokenizer.eos_token_id, tokenizer.pad_token_id):
        if isinstance(token, int):
            return token
    return 0


def verl_row(
    rollout: EngineRollout,
    *,
    prompt_length: int,
    response_length: int,
    fallback_prompt_ids: list[int] | None,
    pad_id: int,
) -> dict[str, Any]:
    """One rollout as verl's row: the ``AgentLoopOutput`` fields but ``metrics`` (pure).

    ``rollout`` comes from ``AgentRollouts(drift="realign", one_sequence=True)``: its calls
    realigned into at most one sequence. The prompt is everything before the sequence's
    first policy token (left-cut to ``prompt_length``, as verl cuts prompts), the response
    the rest (cut to ``response_length``). Excluded rollouts keep the first call's prompt
    (or ``fallback_prompt_ids``) and one masked ``pad_id`` token.
    """
    sequences, stats, excluded = rollout.sequences, rollout.stats, rollout.excluded
    extra: dict[str, Any] = {
        "osmosis_rollout_id": rollout.task.rollout_id,
        "osmosis_status": rollout.result.status.value,
        "osmosis_excluded": excluded.value if excluded else None,
        "osmosis_error": rollout.result.err_message,
        "osmosis_calls": len(rollout.calls),
        "osmosis_drift": stats.drift,
        "osmosis_dropped_tokens": stats.realign_dropped_tokens,
    }
    ok_calls = sum(1 for call in rollout.calls if call.status == "ok")
    if excluded is not None or not sequences:
        prompt = _first_prompt(rollout.calls) or fallback_prompt_ids or [pad_id]
        extra["osmosis_truncated_tokens"] = max(0, len(prompt) - prompt_length)
        return {
            "prompt_ids": prompt[-prompt_length:],
            "response_ids": [pad_id],
            "response_mask": [0],
            "response_logprobs": [0.0],
            "reward_score": 0.0,
            "num_turns": ok_calls + 1,
            "extra_fields": extra,
        }
    (sequence,) = sequences
    split = sequence.loss_mask.index(1)  # the prompt: all before the first policy token
    prompt = list(sequence.token_ids[:split])
    response = slice(split, split + response_length)
    cut_prompt = max(0, len(prompt) - prompt_length)
    cut_response = max(0, len(sequence) - split - response_length)
    extra["osmosis_truncated_tokens"] = cut_prompt + cut_response
    return {
        "prompt_ids": prompt[cut_prompt:],
        "response_ids": list(sequence.token_ids[response]),
        "response_mask": list(sequence.loss_mask[response]),
        "response_logprobs": list(sequence.behaviour_logprobs[response]),
        "reward_score": sequence.reward,
        "num_turns": ok_calls + 1,
        "extra_fields": extra,
    }


def _first_prompt(calls: Sequence[CallRecord]) -> list[int] | None:
    for call in calls:
        if call.prompt_token_ids is not None:
            return list(call.prompt_token_ids)
    return None


def _timings(rollout: EngineRollout, started: float) -> dict[str, float]:
    """verl's per-sample timings from the call records (seconds).

    ``generate_sequences``: time in model calls; ``compute_score``: from the last call's
    end to the result (the Grader, and the workflow's tail); ``tool_calls``: the rest of
    the workflow (tools, between calls).
    """
    generate = sum(call.latency_ms for call in rollout.calls) / 1000
    last_end = max(
        (call.started_at + call.latency_ms / 1000 for call in rollout.calls), default=started
    )
    score = max(0.0, started + rollout.seconds - last_end)
    return {
        "generate_sequences": generate,
        "compute_score": score,
        "tool_calls": max(0.0, rollout.seconds - generate - score),
    }
