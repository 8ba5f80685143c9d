"""Viewer fixtures: eval runs of a test rollout made by the real `osmosis eval run`, a
training run made by the real `osmosis train run`, and headless Chromium."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import signal
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, async_playwright

from osmosis_ai.testing import ChatStub
from tests.eval.conftest import OSMOSIS, Workspace
from tests.train.conftest import tiny_model_dir, tokenizer_dir  # noqa: F401 -- fixtures
from tests.train.training_project import lines as _lines
from tests.train.training_project import workspace as training_workspace
from tests.train.training_project import write_rows

WORKSPACE = Path(__file__).resolve().parent / "workspace"
XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
ARTIFACT_TEXT = "hello from an artifact"
FAILURE = "the tool broke on purpose"

#: Rows of the finished run: a passing two-turn rollout with an artifact and a reward for its
#: second turn, a failing one, and one whose messages carry markup.
FINISHED_ROWS: list[dict[str, Any]] = [
    {"user_prompt": "say token0", "ground_truth": "token0",
     "metadata": {"turns": 2, "artifact": ARTIFACT_TEXT, "turn_reward": 0.25}},
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


def _finished_run(root: Path, rows: list[dict[str, Any]], *args: str) -> Path:
    """The output root of one finished ``osmosis eval run`` of ``rows`` in a new workspace."""

    async def make() -> None:
        async with chatty_workspace(root) as workspace:
            workspace.write_rows(rows)
            code, output = await workspace.run(*args)
            assert code == 0, output  # complete, although a row may fail on purpose

    asyncio.run(make())
    return root / ".osmosis" / "evals"


@pytest.fixture(scope="module")
def finished_run_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The output root of one finished run of ``FINISHED_ROWS`` (made once per module)."""
    yield _finished_run(
        tmp_path_factory.mktemp("viewer") / "ws", FINISHED_ROWS, "--name", "finished"
    )


@pytest.fixture(scope="module")
def repeated_run_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The output root of a run ``repeated``: one passing row, 4 times (pass@1, 2 and 4)."""
    rows = [{"user_prompt": "say token0", "ground_truth": "token0"}]
    root = tmp_path_factory.mktemp("viewer") / "ws"
    yield _finished_run(root, rows, "--name", "repeated", "--n", "4")


def copy_run(run_dir: Path, root: Path, *, live: bool = False) -> Path:
    """A copy of ``run_dir`` in the folder ``root``; ``live``: as it was before its end
    (journal and trials written, ``metrics.json`` not yet)."""
    copy = shutil.copytree(run_dir, root / run_dir.name)
    if live:
        (copy / "metrics.json").unlink()
    return copy


@pytest.fixture
def damaged_root(finished_run_root: Path, tmp_path: Path) -> Path:
    """The finished run, beside copies of it whose files were damaged after the run."""
    root = tmp_path / "evals"
    finished = copy_run(finished_run_root / "finished", root)
    bad_journal = shutil.copytree(finished, root / "bad-journal")
    with (bad_journal / "events.jsonl").open("a") as journal:
        journal.write('{"row_index": "zero"}\n')
    bad_manifest = shutil.copytree(finished, root / "bad-manifest")
    (bad_manifest / "manifest.json").write_text("[]")
    bad_metrics = shutil.copytree(finished, root / "bad-metrics")
    (bad_metrics / "metrics.json").write_text('{"eval_run": "x", "summary": []}')
    return root


#: The JSON lines of a file the training runner wrote.
read_lines = _lines

#: The real training run: 3 steps, held-out evaluations at steps 0, 2 and 3.
TRAIN_RUN = "tiny"


@dataclass(frozen=True)
class ViewedTraining:
    """What one ``osmosis train run --view`` did, stopped with Ctrl-C once it said so."""

    root: Path
    """The workspace's ``.osmosis`` folder, holding the run."""
    output: str
    """Everything the command printed."""
    page: dict[str, Any]
    """What its viewer served for the run (``/api/train/<run>``) after the last step; empty
    when it did not serve it."""
    returncode: int


async def _train_with_view(config: Path) -> ViewedTraining:
    process = await asyncio.create_subprocess_exec(
        OSMOSIS, "train", "run", str(config), "--view",
        cwd=config.parents[2],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert process.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(120):
            while not lines or "viewer stays up" not in lines[-1]:
                line = await process.stdout.readline()
                assert line, "".join(lines)  # it ended without serving on
                lines.append(line.decode())
        found = re.search(r"viewer: (http://[^/\s]+)/", "".join(lines))
        assert found, "".join(lines)
        async with httpx2.AsyncClient(base_url=found.group(1), timeout=30) as client:
            response = await client.get(f"/api/train/{TRAIN_RUN}")
        page = response.json() if response.status_code == 200 else {}
    finally:
        process.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            rest, _ = await process.communicate()
    assert process.returncode is not None
    output = "".join(lines) + rest.decode()
    return ViewedTraining(config.parents[2] / ".osmosis", output, page, process.returncode)


@pytest.fixture(scope="session")
def viewed_training(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model_dir: Path,  # noqa: F811 -- the fixture imported above
) -> ViewedTraining:
    """One real ``osmosis train run --view`` of the tiny model (made once per session)."""
    root = tmp_path_factory.mktemp("viewer-train") / "ws"
    config = training_workspace(root, tiny_model_dir, "steps = 3\n[eval]\nevery = 2")
    # Drawn rewards: every step has groups to learn from, so each has a loss and a KL.
    write_rows(root, metadata={"random_reward": True})
    return asyncio.run(_train_with_view(config))


@pytest.fixture(scope="session")
def train_run_root(viewed_training: ViewedTraining) -> Path:
    """The ``.osmosis`` folder holding the finished training run ``TRAIN_RUN``."""
    assert viewed_training.returncode == 0, viewed_training.output
    return viewed_training.root


async def read_line(stream: Any, pattern: re.Pattern[str]) -> re.Match[str]:
    """The first line of a child's output that matches ``pattern`` (within a minute)."""
    async with asyncio.timeout(60):
        while line := await stream.readline():
            if match := pattern.search(line.decode()):
                return match
    raise AssertionError(f"no line matched {pattern.pattern}")


# ---- headless Chromium ------------------------------------------------------------------

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    executable = shutil.which("chromium")
    assert executable, "install Debian's chromium package (.ci/run does) to run browser tests"
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


@pytest_asyncio.fixture(loop_scope="module")
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context()
    opened = await context.new_page()
    yield opened
    await context.close()
