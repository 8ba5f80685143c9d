"""The seed document's framework-free code examples run verbatim against this package."""

from __future__ import annotations

from pathlib import Path

import pytest

from osmosis_ai.rollout import (
    AgentWorkflowContext,
    ExecutionRequest,
    LocalBackend,
    RolloutContext,
    RolloutStatus,
    get_rollout_context,
)
from tests.seed.base_class import MyWorkflow
from tests.seed.custom_sample_source import MySampleSource
from tests.seed.explicit_workflow import ExplicitWorkflow
from tests.seed.search_workflow import SearchWorkflow, SearchWorkflowConfig
from tests.seed.tracing_workflow import TracingWorkflow

SEED_DIR = Path(__file__).resolve().parents[1] / "seed"
SEED_DOC = Path(__file__).resolve().parents[3] / "shared" / "seed" / "AgentWorkflow.md"
PROMPT = [{"role": "user", "content": "What is 6*7?"}]


def _request(rollout_id: str = "r1") -> ExecutionRequest:
    return ExecutionRequest(id=rollout_id, prompt=PROMPT, label="42")


async def test_explicit_workflow_returns_prompt_plus_answer_with_metrics() -> None:
    outcome = await LocalBackend(workflow=ExplicitWorkflow).execute(_request())
    result = outcome.result
    assert result.status is RolloutStatus.SUCCESS
    assert result.sample is not None
    assert result.sample.messages == [*PROMPT, {"role": "assistant", "content": "done"}]
    assert result.sample.metrics == {"steps": 1.0}
    assert result.sample.label == "42"


async def test_base_class_workflow_without_source_succeeds_with_no_sample() -> None:
    outcome = await LocalBackend(workflow=MyWorkflow).execute(_request())
    assert outcome.result.status is RolloutStatus.SUCCESS
    assert outcome.result.sample is None


async def test_tracing_workflow_writes_into_the_rollout_artifacts_dir(artifact_root: Path) -> None:
    outcome = await LocalBackend(workflow=TracingWorkflow).execute(_request("trace-1"))
    assert outcome.result.status is RolloutStatus.SUCCESS
    assert (artifact_root / "trace-1" / "artifacts" / "run.log").read_text() == "started\n"


async def test_search_workflow_receives_a_private_copy_of_its_config() -> None:
    from tests.seed.local_backend_wiring import backend

    seen: list[SearchWorkflowConfig | None] = []

    class Spy(SearchWorkflow):
        async def run(self, ctx: AgentWorkflowContext[SearchWorkflowConfig]) -> None:
            seen.append(ctx.config)
            await super().run(ctx)

    spy_backend = LocalBackend(workflow=Spy, workflow_config=backend.workflow_config)
    await spy_backend.execute(_request())
    assert backend.health()["concurrency"]["max_concurrent"] == 4
    assert seen[0] == backend.workflow_config
    assert seen[0] is not backend.workflow_config


async def test_custom_sample_source_gives_sample_and_bounded_isolated_preview() -> None:
    history = [{"role": "user", "content": str(i)} for i in range(5)]
    source = MySampleSource(history)
    with RolloutContext(rollout_id="r1") as ctx:
        ctx.set_sample_source(source)
        assert get_rollout_context() is ctx
        sample = await ctx.get_sample()
    assert sample is not None and sample.messages == history
    preview = await source.get_preview(2)
    assert preview is not None and preview.messages == history[-2:]
    preview.messages[0]["content"] = "changed"
    assert history[3]["content"] == "3"
    assert await source.get_preview(0) is None


def _code_lines(path: Path) -> list[str]:
    return [
        line
        for line in path.read_text().splitlines()
        if line.strip() and not line.startswith("from tests.")
    ]


def _matches_in_order(doc_lines: list[str], lines: list[str], start: int) -> bool:
    position = start
    for line in lines[1:]:
        try:
            position = doc_lines.index(line, position + 1, start + 80)
        except ValueError:
            return False
    return True


@pytest.mark.parametrize(
    "example", sorted(p.name for p in SEED_DIR.glob("*.py") if p.name != "__init__.py")
)
def test_example_copy_matches_the_seed_document(example: str) -> None:
    if not SEED_DOC.exists():
        pytest.skip(f"seed document not present at {SEED_DOC}")
    doc_lines = SEED_DOC.read_text().splitlines()
    lines = _code_lines(SEED_DIR / example)
    starts = [i for i, line in enumerate(doc_lines) if line == lines[0]]
    assert any(_matches_in_order(doc_lines, lines, start) for start in starts), (
        f"{example} no longer matches an example of {SEED_DOC.name}"
    )
