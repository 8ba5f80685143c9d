"""Viewer fixtures: eval runs of a test rollout made by the real `osmosis eval run`."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.testing import ChatStub
from tests.eval.conftest import Workspace

WORKSPACE = Path(__file__).resolve().parent / "workspace"
XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
ARTIFACT_TEXT = "hello from an artifact"
FAILURE = "the tool broke on purpose"

#: Rows of the finished run: a passing two-turn rollout with an artifact, a failing one, and
#: one whose messages carry markup.
FINISHED_ROWS: list[dict[str, Any]] = [
    {"user_prompt": "say token0", "ground_truth": "token0",
     "metadata": {"turns": 2, "artifact": ARTIFACT_TEXT}},
    {"user_prompt": "say token1", "ground_truth": "token1", "metadata": {"fail": FAILURE}},
    {"user_prompt": XSS, "ground_truth": "nope"},
]  # fmt: skip


@contextlib.asynccontextmanager
async def chatty_workspace(root: Path) -> AsyncIterator[Workspace]:
    """A copy of the viewer's workspace at ``root``, wired to a running stub model."""
    shutil.copytree(WORKSPACE, root)
    (root / "configs" / "eval").mkdir(parents=True)
    (root / "data").mkdir()
    async with ChatStub() as stub:
        workspace = Workspace(
            root,
            root / "configs" / "eval" / "chatty.toml",
            root / "data" / "rows.jsonl",
            stub,
            rollout="chatty",
        )
        workspace.write_config()
        yield workspace


@pytest.fixture(scope="module")
def finished_run_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The output root of one finished run of ``FINISHED_ROWS`` (made once per module)."""
    import asyncio

    root = tmp_path_factory.mktemp("viewer") / "ws"

    async def make() -> None:
        async with chatty_workspace(root) as workspace:
            workspace.write_rows(FINISHED_ROWS)
            code, output = await workspace.run("--name", "finished")
            assert code == 0, output  # complete, although one row fails on purpose

    asyncio.run(make())
    yield root / ".osmosis" / "evals"
