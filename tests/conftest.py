"""Test-wide fixtures: every test gets an isolated environment and storage root."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from osmosis_ai.testing import ChatStub

_ISOLATED_PREFIXES = ("OSMOSIS_", "_OSMOSIS_")

# Harbor needs Python 3.12+: its tests run in their own environment (`make test-harbor`).
# SkyRL and verl likewise (`make test-engines`, .venv-engines).
collect_ignore = ["rollout/backend/harbor", "train/engines"] if sys.version_info < (3, 12) else []


# The modules that take longest (from `--durations`), collected first: the suite runs on two
# workers a module at a time (`-n 2 --dist loadfile --no-loadscope-reorder`, see the
# Makefile's suite-main: without that flag xdist hands out the modules with the most tests
# first), and a long module handed out last would run alone at the end while the other
# worker sits idle.
_LONGEST_FIRST = (
    "train/generation/test_vllm.py",
    "train/runs/test_frameworks.py",
    "train/test_recipes.py",
    "train/runs/test_tool_formats.py",
    "reliability/test_chaos_eval.py",
    "environments/test_verifiers.py",
    "train/runs/test_runner.py",
    "train/test_gpu_check.py",
    "train/learner/test_lora.py",
    "environments/test_openenv.py",
    "environments/test_reasoning_gym_runs.py",
    "docs/test_howtos.py",
    "reliability/test_chaos.py",
    "train/test_model.py",
    "test_scaffold.py",
    "train/bookkeeping/test_trackers.py",
    "gateway/test_embedded_policy.py",
    "test_serving.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the longest modules first (a stable sort: the rest keep their order)."""
    tests = Path(__file__).resolve().parent
    rank = {module: index for index, module in enumerate(_LONGEST_FIRST)}

    def module_rank(item: pytest.Item) -> int:
        path = Path(item.path)
        module = path.relative_to(tests).as_posix() if path.is_relative_to(tests) else ""
        return rank.get(module, len(rank))

    items.sort(key=module_rank)


def pytest_configure(config: pytest.Config) -> None:
    """Settings Ray reads when it is first imported (so before any test module is), the
    Ctrl-C the CLI tests send, and the compute threads of each process.

    A local Ray instance then binds 127.0.0.1 (Ray otherwise picks this machine's network
    address, and tests stay on loopback), and token authentication is off: child processes
    run with an isolated HOME, where Ray's token file is not.
    """
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # One compute thread a process (torch, and the embedded model, which follows it): the
    # suite's workers, their CLI children and CI's other phases share the cores, and two
    # threads that wait for each other by spinning then stall when either is descheduled
    # (beside three busy processes the embedded model made 8.4 tokens/s on two threads, 31 on
    # one: docs/gateway.md). A user's default is one fewer thread than cores: on a bigger
    # machine than CI's, one a process is still the right count for a suite on every core.
    # Export OMP_NUM_THREADS to run a test with more.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # A shell without job control starts background commands with SIGINT ignored, and
    # children inherit that: the CLI would then never see the Ctrl-C the tests send it. A
    # handler (unlike "ignore") is reset to the default in a child, as from a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _shared_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The converted-model cache of the whole run: in the temporary root every xdist worker
    shares (`embedded_model_dir` converts under an inter-process lock, so a worker or child
    process that asks meanwhile waits and reuses it)."""
    root = tmp_path_factory.getbasetemp()
    shared = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "embedded-models"
    shared.mkdir(exist_ok=True)
    return shared


@pytest.fixture(autouse=True)
def isolated_environment(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Clear osmosis variables, point HOME and the artifact root into ``tmp_path``.

    HOME's converted-model cache (``~/.osmosis/models``) is the run's shared one: each run of
    ``osmosis train`` on the embedded model would otherwise convert it again (~20 s)."""
    for name in list(os.environ):
        if name.startswith(_ISOLATED_PREFIXES):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    (home / ".osmosis").mkdir(parents=True)
    (home / ".osmosis" / "models").symlink_to(_shared_models(tmp_path_factory))
    monkeypatch.setenv("HOME", str(home))
    root = tmp_path / "artifact-root"
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_ARTIFACT_ROOT", str(root))
    yield root


@pytest.fixture
def artifact_root(isolated_environment: Path) -> Path:
    """The per-test artifact root (``_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``)."""
    return isolated_environment


@pytest_asyncio.fixture
async def stub() -> AsyncIterator[ChatStub]:
    """A running `ChatStub` (a real OpenAI-compatible HTTP stub on 127.0.0.1)."""
    async with ChatStub() as running:
        yield running


@pytest.fixture(scope="session")
def embedded_hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model converted to a HuggingFace directory once for the whole run (~18 s),
    in the run's shared cache (`_shared_models`, also every test's ``~/.osmosis/models``)."""
    from osmosis_ai.train.model import embedded_model_dir

    return embedded_model_dir(_shared_models(tmp_path_factory))


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """One local Ray instance for the whole session (2 CPUs, no dashboard, on 127.0.0.1).

    Returns its GCS address, which child processes join (see `pytest_configure`).
    """
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    try:
        address = str(ray.get_runtime_context().gcs_address)
        assert address.startswith("127.0.0.1:"), address
        yield address
    finally:
        ray.shutdown()
