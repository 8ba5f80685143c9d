"""OsmosisAgentLoop driven as verl drives it, on a real CPU engine behind verl's own client.

The server manager is verl's ``LLMServerClient`` with verl's ``GlobalRequestLoadBalancer``
actor in front of a llama.cpp server actor (the embedded model, token-in/token-out; see
``_verl_engine``). The loop is built by ``hydra.utils.instantiate`` from an
``agent_loop_config_path``-style entry, as ``AgentLoopWorker`` builds it, once per sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import pytest_asyncio

pytest.importorskip("verl.experimental.agent_loop.agent_loop")

import hydra
import ray
from hydra.errors import InstantiationException
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.utils.dataset.rl_dataset import RLHFDataset

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway import Gateway
from osmosis_ai.gateway.policies.chat_front import template_messages
from osmosis_ai.gateway.request import parse_chat_request
from osmosis_ai.train.engines import verl_policy
from osmosis_ai.train.engines.verl import (
    OsmosisAgentLoop,
    close_shared_rollouts,
)
from osmosis_ai.train.engines.verl_policy import VerlServerPolicy, sampling_params_for
from tests.train.engines._verl_engine import Served, VerlEngine, start_engine

# Starting the engine (two actor processes importing torch, the model load) takes most of
# the time on a busy 2-core machine; the project's 120 s hang guard is too tight for it.
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

WORKFLOWS = "tests.train.engines._verl_workflows"
PROMPT = [{"role": "user", "content": "What is 22 + 6?"}]
# verl's worker-level sampling parameters (AgentLoopWorker.generate_sequences), greedy.
SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}
TOOL_CALL = (
    'root ::= "<tool_call>\\n{\\"name\\": \\"calculator\\", \\"arguments\\": '
    '{\\"expression\\": \\"" [1-9] "+" [1-9] "\\"}}\\n</tool_call>"'
)


@pytest.fixture(scope="module")
def engine(ray_cluster: str) -> Iterator[VerlEngine]:
    started = start_engine()
    ray.get(started.server.served.remote())  # wait for the model to load (fixture time)
    yield started
    ray.kill(started.server)
    ray.kill(started.load_balancer)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


@pytest_asyncio.fixture(scope="module", loop_scope="module", autouse=True)
async def shared_rollouts() -> AsyncIterator[None]:
    yield
    await close_shared_rollouts()


def _loop(
    engine: VerlEngine,
    tokenizer: Any,
    entry: Any,
    *,
    algorithm: dict[str, Any] | None = None,
    **rollout: Any,
) -> Any:
    """The agent loop as ``AgentLoopWorker._run_agent_loop`` instantiates it."""
    config = engine.config.copy()
    config.actor_rollout_ref.rollout.update(rollout)
    if algorithm is not None:
        config.algorithm = algorithm
    return hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=config),
        server_manager=engine.client,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )


def _entry(workflow: str, grader: str | None = "MetadataReward", **settings: Any) -> Any:
    item: dict[str, Any] = {
        "name": "osmosis",
        "_target_": "osmosis_ai.train.engines.verl.OsmosisAgentLoop",
        "workflow": f"{WORKFLOWS}:{workflow}",
        **settings,
    }
    if grader:
        item["grader"] = f"{WORKFLOWS}:{grader}"
    return OmegaConf.create([item])[0]


def _row(uid: str = "g1", **extra: Any) -> dict[str, Any]:
    return {
        "raw_prompt": PROMPT,
        "reward_model": {"ground_truth": "28", "style": "rule"},
        "extra_info": {"reward": 0.75, "truth": "28", **extra},
        "uid": uid,
        "index": 0,
        "data_source": "arithmetic",
    }


async def _served(engine: VerlEngine, output: AgentLoopOutput) -> list[Served]:
    rollout_id = output.extra_fields["osmosis_rollout_id"]
    served: list[Served] = await engine.server.served.remote()
    return [s for s in served if s.request_id == rollout_id]


def _assert_policy_tokens_are_served(output: AgentLoopOutput, served: list[Served]) -> None:
    """The one sequence is the last call's context and completion, and every trained token
    is one the engine sampled, with the logprob it gave."""
    tokens = output.prompt_ids + output.response_ids
    last = served[-1]
    assert tokens == last.prompt_ids + last.token_ids
    assert output.response_mask[-len(last.token_ids) :] == [1] * len(last.token_ids)
    assert output.response_logprobs[-len(last.token_ids) :] == last.log_probs
    offset = len(output.prompt_ids)
    for position, flag in enumerate(output.response_mask):
        if not flag:
            assert output.response_logprobs[position] == 0.0
            continue
        absolute = offset + position
        assert any(
            tokens[: len(s.prompt_ids)] == s.prompt_ids
            and 0 <= absolute - len(s.prompt_ids) < len(s.token_ids)
            and s.token_ids[absolute - len(s.prompt_ids)] == tokens[absolute]
            and s.log_probs[absolute - len(s.prompt_ids)] == output.response_logprobs[position]
            for s in served
        ), position


async def test_a_chaining_conversation_is_one_row_of_engine_tokens(
    engine: VerlEngine, tokenizer: Any, tmp_path: Path
) -> None:
    # The entry is read the way verl reads agent_loop_config_path.
    path = tmp_path / "agent_loops.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.create([_entry("FollowUp")])))
    (entry,) = OmegaConf.load(path)
    loop = _loop(engine, tokenizer, entry)
    assert isinstance(loop, OsmosisAgentLoop)

    output = await loop.run(dict(SAMPLING), **_row())

    assert isinstance(output, AgentLoopOutput)
    served = await _served(engine, output)
    assert len(served) == 2  # routed with request_id = the rollout id
    assert output.prompt_ids == served[0].prompt_ids
    _assert_policy_tokens_are_served(output, served)
    # The follow-up user turn is context: in the response, never trained.
    user_turn = tokenizer.encode("Say it again, shorter.", add_special_tokens=False)
    response = output.response_ids
    start = next(i for i in range(len(response)) if response[i : i + len(user_turn)] == user_turn)
    assert output.response_mask[start : start + len(user_turn)] == [0] * len(user_turn)
    assert output.reward_score == 0.75  # the Grader's, from extra_info and the ground truth
    assert output.num_turns == 3
    assert output.metrics.generate_sequences > 0
    assert output.extra_fields["osmosis_status"] == "success"
    assert output.extra_fields["osmosis_excluded"] is None
    assert output.extra_fields["osmosis_calls"] == 2
    # The trainer's sampling wins over the workflow's; the workflow's max_tokens is kept.
    assert all(s.sampling_params["temperature"] == 0.0 for s in served)
    assert all(s.sampling_params["max_tokens"] == 12 for s in served)


async def test_a_rewritten_history_is_realigned_into_one_sequence(
    engine: VerlEngine, tokenizer: Any
) -> None:
    output = await _loop(engine, tokenizer, _entry("Rewrite")).run(dict(SAMPLING), **_row())
    served = await _served(engine, output)
    assert len(served) == 2
    _assert_policy_tokens_are_served(output, served)
    # The second prompt does not continue the first call: its completion cannot be trained
    # in one sequence with the second, so it is dropped and counted.
    first, second = served
    assert second.prompt_ids[: len(first.prompt_ids)] != first.prompt_ids
    assert output.prompt_ids == second.prompt_ids
    assert sum(output.response_mask) == len(second.token_ids)
    assert output.extra_fields["osmosis_drift"] == 1
    assert output.extra_fields["osmosis_dropped_tokens"] == len(first.token_ids)


async def test_tool_calls_are_parsed_by_verls_hermes_parser(
    engine: VerlEngine, tokenizer: Any
) -> None:
    await engine.server.constrain.remote(TOOL_CALL, calls=1)
    output = await _loop(engine, tokenizer, _entry("Calculator")).run(dict(SAMPLING), **_row())
    first, second = await _served(engine, output)
    generated = tokenizer.decode(first.token_ids)
    expression = re.search(r'"expression": "(\d)\+(\d)"', generated)
    assert expression is not None, generated
    total = int(expression[1]) + int(expression[2])
    # The workflow received a parsed tool call (it computed the sum from its arguments)
    # and its tool result went back to the engine as context.
    assert f"<|im_start|>tool\n{total}<|im_end|>" in tokenizer.decode(second.prompt_ids)
    _assert_policy_tokens_are_served(output, [first, second])
    assert output.extra_fields["osmosis_status"] == "success"


async def test_failed_timed_out_and_removed_rollouts_train_nothing(
    engine: VerlEngine, tokenizer: Any
) -> None:
    failing = _loop(engine, tokenizer, _entry("FailsAfterOneCall"))
    slow = _loop(engine, tokenizer, _entry("Sleeps", agent_timeout_sec=1))
    removed = _loop(engine, tokenizer, _entry("FollowUp", grader="Removes"))
    outputs = await asyncio.gather(
        failing.run(dict(SAMPLING), **_row("g-fail")),
        slow.run(dict(SAMPLING), **_row("g-slow")),
        removed.run(dict(SAMPLING), **_row("g-removed")),
    )
    for output in outputs:
        assert output.response_mask == [0]
        assert output.reward_score == 0.0
    failed, timed_out, dropped = (output.extra_fields for output in outputs)
    assert (failed["osmosis_status"], failed["osmosis_excluded"]) == ("failure", "failed")
    assert "the tool crashed" in failed["osmosis_error"]
    assert outputs[0].prompt_ids == (await _served(engine, outputs[0]))[0].prompt_ids
    assert timed_out["osmosis_excluded"] == "failed"
    assert timed_out["osmosis_calls"] == 0
    fallback = tokenizer.apply_chat_template(
        PROMPT, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert outputs[1].prompt_ids == list(fallback)  # no call made: the templated prompt
    assert dropped["osmosis_excluded"] == "removed"


async def test_an_excluded_rollout_under_verls_own_estimator_warns_once_naming_the_fix(
    engine: VerlEngine, tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Under ``algorithm.adv_estimator=grpo`` a failed rollout's 0.0 would enter its group's
    statistics: the loop says so once, naming the estimators that leave it out; under
    ``osmosis_grpo`` it says nothing."""
    from osmosis_ai.train.engines import verl as adapter

    adapter._warned_estimator = False
    fails = _entry("FailsAfterOneCall")
    for estimator in ("osmosis_grpo", "grpo", "grpo"):
        loop = _loop(engine, tokenizer, fails, algorithm={"adv_estimator": estimator})
        await loop.run(dict(SAMPLING), **_row(f"g-{estimator}"))
    warned = [r.getMessage() for r in caplog.records if r.name == adapter.__name__]
    assert len(warned) == 1, warned
    assert "algorithm.adv_estimator=grpo" in warned[0] and "osmosis_grpo" in warned[0]


async def test_the_response_is_cut_to_verls_response_length(
    engine: VerlEngine, tokenizer: Any
) -> None:
    loop = _loop(engine, tokenizer, _entry("FollowUp"), response_length=10)
    output = await loop.run(dict(SAMPLING), **_row())
    served = await _served(engine, output)
    # Each call is capped at the response length (as verl's vLLM server caps it), and the
    # one sequence is cut to it, with the cut counted.
    assert all(s.sampling_params["max_tokens"] == 10 for s in served)
    sequence = served[-1].prompt_ids + served[-1].token_ids
    assert output.prompt_ids == served[0].prompt_ids
    assert output.prompt_ids + output.response_ids == sequence[: len(output.prompt_ids) + 10]
    first = min(10, len(served[0].token_ids))
    assert output.response_mask[:first] == [1] * first
    cut = len(sequence) - len(output.prompt_ids) - 10
    assert cut > 0
    assert output.extra_fields["osmosis_truncated_tokens"] == cut


async def test_rollouts_run_on_ray_actors(engine: VerlEngine, tokenizer: Any) -> None:
    entry = _entry("FollowUp", backend="ray")
    outputs = await asyncio.gather(
        *(_loop(engine, tokenizer, entry).run(dict(SAMPLING), **_row(f"ray-{i}")) for i in range(4))
    )
    assert [o.extra_fields["osmosis_status"] for o in outputs] == ["success"] * 4
    assert [o.reward_score for o in outputs] == [0.75] * 4
    for output in outputs:
        _assert_policy_tokens_are_served(output, await _served(engine, output))


async def test_the_loop_is_registered_and_bad_settings_are_named(
    engine: VerlEngine, tokenizer: Any
) -> None:
    assert _agent_loop_registry["osmosis"]["_target_"] == (
        "osmosis_ai.train.engines.verl.OsmosisAgentLoop"
    )

    # hydra wraps what the constructor raises (verl's worker shows that message).
    def refused(entry: Any) -> str:
        with pytest.raises(InstantiationException) as raised:
            _loop(engine, tokenizer, entry)
        assert isinstance(raised.value.__cause__, ConfigError)
        return str(raised.value.__cause__)

    typo = refused(OmegaConf.create({**_entry("FollowUp"), "workflw": "x"}))
    assert re.search(r"unknown osmosis agent loop setting.*'workflw'.*workflow", typo)
    missing = refused(OmegaConf.create({"_target_": _entry("FollowUp")["_target_"]}))
    assert re.search(r"needs 'workflow'.*\+osmosis\.workflow", missing)
    with pytest.raises(ConfigError, match=r"tool_parser 'nope'.*hermes"):
        await _loop(engine, tokenizer, _entry("FollowUp", tool_parser="nope")).run(
            dict(SAMPLING), **_row()
        )
    with pytest.raises(ConfigError, match="'raw_prompt' must be a list of chat messages"):
        await _loop(engine, tokenizer, _entry("FollowUp")).run(
            dict(SAMPLING), **{**_row(), "raw_prompt": "What is 22 + 6?"}
        )


@contextlib.asynccontextmanager
async def _verl_gateway(
    engine: VerlEngine, tokenizer: Any, rollout_id: str
) -> AsyncIterator[tuple[Gateway, httpx2.AsyncClient, str]]:
    """A gateway in front of the engine through `VerlServerPolicy`, an authorised client,
    and the rollout's chat completions URL."""
    async with Gateway(VerlServerPolicy(engine.client, tokenizer)) as gateway:
        headers = {"Authorization": f"Bearer {gateway.token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=120) as http:
            yield gateway, http, gateway.chat_completions_url(rollout_id) + "/chat/completions"


async def test_engine_errors_become_the_gateways_error_answers(
    engine: VerlEngine, tokenizer: Any
) -> None:
    async with _verl_gateway(engine, tokenizer, "errors") as (_, http, url):
        body = {"messages": PROMPT, "max_tokens": 4}
        await engine.server.fail_next.remote("raise")
        failed = await http.post(url, json=body)
        await engine.server.fail_next.remote("abort")
        aborted = await http.post(url, json=body)
        answered = await http.post(url, json=body)
    assert failed.status_code == 502
    assert "verl inference server failed" in failed.json()["error"]["message"]
    assert "out of KV cache" in failed.json()["error"]["message"]
    assert aborted.status_code == 503
    assert "aborted" in aborted.json()["error"]["message"]
    assert answered.status_code == 200
    assert answered.json()["choices"][0]["finish_reason"] == "length"


async def test_token_pieces_are_shown_to_a_caller_that_asks_for_logprobs(
    engine: VerlEngine, tokenizer: Any
) -> None:
    async with _verl_gateway(engine, tokenizer, "pieces") as (gateway, http, url):
        body = {"messages": PROMPT, "max_tokens": 6}
        asked = (await http.post(url, json={**body, "logprobs": True})).json()
        plain = (await http.post(url, json=body)).json()
        asked_record, plain_record = gateway.records.calls("pieces")
    ids = list(asked_record.completion_token_ids or ())
    entries = asked["choices"][0]["logprobs"]["content"]
    assert [entry["token"] for entry in entries] == [tokenizer.decode([i]) for i in ids]
    assert [entry["logprob"] for entry in entries] == list(asked_record.logprobs or ())
    assert "logprobs" not in plain["choices"][0]
    # Unasked, the pieces are skipped but every sampled id keeps its logprob in the record.
    plain_ids = plain_record.completion_token_ids or ()
    assert len(plain_record.logprobs or ()) == len(plain_ids) > 0


async def test_prompt_ids_are_the_templates_own_whether_encoded_inline_or_in_a_thread(
    engine: VerlEngine, tokenizer: Any
) -> None:
    # Little new text is encoded on the event loop, more in a worker thread: same ids.
    answered = [*PROMPT, {"role": "assistant", "content": "28"}]
    many = "Now add these: " + " + ".join(str(number) for number in range(60))
    conversations = [
        PROMPT,
        [*answered, {"role": "user", "content": "And 3 + 3?"}],
        [*answered, {"role": "user", "content": many}],
    ]
    assert len(many) > verl_policy._INLINE_ENCODE_CHARS
    async with _verl_gateway(engine, tokenizer, "prompts") as (gateway, http, url):
        for messages in conversations:
            response = await http.post(url, json={"messages": messages, "max_tokens": 2})
            assert response.status_code == 200
        records = gateway.records.calls("prompts")
    for messages, record in zip(conversations, records, strict=True):
        own = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert list(record.prompt_token_ids or ()) == list(own)


async def test_sampling_and_messages_are_mapped_for_verl() -> None:
    request = parse_chat_request(
        {"messages": PROMPT, "temperature": 1.3, "top_p": 0.5, "max_completion_tokens": 500}
    )
    trainer = {"temperature": 0.7, "top_k": -1}
    assert sampling_params_for(request, trainer, max_tokens=64) == {
        "temperature": 0.7,
        "top_k": -1,
        "top_p": 0.5,
        "max_tokens": 64,
        "logprobs": True,
    }
    assert sampling_params_for(request, None, max_tokens=1024)["temperature"] == 1.3
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    bad = {"id": "d", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
    converted = template_messages([{"role": "assistant", "tool_calls": [call, bad]}])
    assert converted[0]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert converted[0]["tool_calls"][1] == bad
