"""Harbor fixtures: tasks on disk, the bubblewrap environment, the embedded-model gateway,
and a rollout server over a HarborBackend (Python 3.12 only; `make test-harbor` runs them)."""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from osmosis_ai._serving import running_server
from osmosis_ai.gateway import EmbeddedPolicy, Gateway
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.server import create_rollout_server

# Harbor imports LiteLLM, which otherwise fetches its cost map from the internet.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
PROJECT = Path(__file__).with_name("project")
sys.path.insert(0, str(PROJECT))  # the bundled project is imported as top-level modules

from harbor.models.trial.config import EnvironmentConfig  # noqa: E402

from osmosis_ai.rollout.backend.harbor import HarborBackend  # noqa: E402
from osmosis_ai.rollout.backend.harbor.bubblewrap import BUBBLEWRAP_ENVIRONMENT  # noqa: E402

PROMPT = [{"role": "user", "content": "Say hello."}]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Harbor 0.25 warns about its own deprecated internals; those are not our failures.
    for item in items:
        item.add_marker(pytest.mark.filterwarnings("ignore::DeprecationWarning:harbor"))


def write_task(
    root: Path,
    name: str,
    *,
    instruction: str = "Placeholder: template mode replaces this.",
    test_sh: str | None = None,
    solve_sh: str | None = None,
    network_mode: str = "public",
) -> Path:
    """A Harbor task directory (its Dockerfile is not built by the bubblewrap environment)."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "task.toml").write_text(
        textwrap.dedent(
            f"""\
            schema_version = "1.4"
            [agent]
            timeout_sec = 120.0
            [verifier]
            timeout_sec = 60.0
            [environment]
            network_mode = "{network_mode}"
            workdir = "/app"
            """
        )
    )
    (task / "instruction.md").write_text(instruction)
    (task / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\n")
    for folder, script, content in (
        ("tests", "test.sh", test_sh),
        ("solution", "solve.sh", solve_sh),
    ):
        if content is not None:
            (task / folder).mkdir()
            (task / folder / script).write_text("#!/bin/bash\n" + textwrap.dedent(content))
            (task / folder / script).chmod(0o755)
    return task


def bubblewrap() -> Any:
    return EnvironmentConfig(import_path=BUBBLEWRAP_ENVIRONMENT)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway() -> AsyncIterator[Gateway]:
    async with Gateway(EmbeddedPolicy(), sampling={"temperature": 0, "max_tokens": 48}) as running:
        yield running


class Served:
    """A rollout server over a HarborBackend, with a protocol client."""

    def __init__(self, backend: HarborBackend, client: RolloutClient, gateway: Gateway):
        self.backend = backend
        self.client = client
        self.gateway = gateway

    async def run(self, rollout_id: str, **fields: Any) -> Any:
        handle = await self.client.run_rollout(
            fields.pop("prompt", PROMPT),
            self.gateway.chat_completions_url(rollout_id),
            rollout_id,
            llm_api_key=self.gateway.token,
            **fields,
        )
        return await handle


ServeHarbor = Callable[..., contextlib.AbstractAsyncContextManager[Served]]


@pytest.fixture
def serve_harbor(gateway: Gateway, tmp_path: Path) -> ServeHarbor:
    """``async with serve_harbor(tasks_dir=..., agent=..., **backend_kwargs) as served``."""

    @contextlib.asynccontextmanager
    async def start(
        server_options: dict[str, Any] | None = None, **kwargs: Any
    ) -> AsyncIterator[Served]:
        kwargs.setdefault("environment_config", bubblewrap())
        kwargs.setdefault("container_python", sys.executable)
        kwargs.setdefault("trials_dir", tmp_path / "trials")
        kwargs.setdefault("n_concurrent", 2)
        backend = HarborBackend(**kwargs)
        app = create_rollout_server(
            backend=backend, configure_logging=False, **(server_options or {})
        )
        async with running_server(app) as server, RolloutClient(url=server.base_url) as client:
            yield Served(backend, client, gateway)

    return start
