"""Bundles: content-addressed wheels of a project that run the phases after unpacking."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout.backend.spec import project_root
from osmosis_ai.rollout.bundle import build_bundle
from osmosis_ai.rollout.container import ContainerInput

PROJECT_FILES = {
    "pkg/__init__.py": "",
    "pkg/flow.py": """\
        from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowConfig, Grader

        from pkg.words import WORD

        class Cfg(AgentWorkflowConfig):
            answer: str = WORD

        class Flow(AgentWorkflow[Cfg]):
            async def run(self, ctx):
                return [*ctx.prompt, {"role": "assistant", "content": self.config.answer}]

        class Judge(Grader):
            async def grade(self, ctx):
                ctx.set_reward(float(ctx.sample.messages[-1]["content"] == ctx.label))
        """,
    "pkg/words.py": "WORD = 'hello'\n",
    ".venv/lib/huge.py": "raise SystemExit('never bundled')\n",
}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    root = tmp_path / "project"
    for name, text in PROJECT_FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(root))
    import importlib

    flow = importlib.import_module("pkg.flow")
    yield root, flow
    for name in ("pkg.flow", "pkg.words", "pkg"):
        sys.modules.pop(name, None)


def test_bundle_runs_both_phases_after_unpacking(project: Any, tmp_path: Path) -> None:
    root, flow = project
    assert project_root(flow.Flow) == root.resolve()
    bundle = build_bundle(
        project=root,
        workflow=flow.Flow,
        workflow_config=flow.Cfg(name="c", answer="7"),
        grader=flow.Judge,
        cache_dir=tmp_path / "cache",
    )
    names = zipfile.ZipFile(bundle.wheel).namelist()
    assert f"{bundle.package}/project/pkg/words.py" in names
    assert not any(".venv" in name for name in names)
    unpacked, agent, tests = tmp_path / "unpacked", tmp_path / "agent", tmp_path / "tests"
    subprocess.run(
        [sys.executable, "-m", "zipfile", "-e", str(bundle.wheel), str(unpacked)], check=True
    )
    agent.mkdir()
    tests.mkdir()
    prompt = [{"role": "user", "content": "q"}]
    (agent / "container_input.json").write_text(
        ContainerInput(rollout_id="b1", prompt=prompt).model_dump_json()
    )
    (tests / "container_input.json").write_text(
        ContainerInput(rollout_id="b1", prompt=prompt, label="7").model_dump_json()
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(unpacked),  # the project is NOT on the path: only the bundle
        "OSMOSIS_AGENT_LOGS_DIR": str(agent),
        "OSMOSIS_VERIFIER_LOGS_DIR": str(tmp_path / "verifier"),
        "OSMOSIS_TESTS_DIR": str(tests),
        "OSMOSIS_ARTIFACTS_DIR": str(tmp_path / "artifacts"),
    }
    for phase in ("agent", "grade"):
        done = subprocess.run(
            bundle.command(phase, sys.executable).split(), env=env, cwd="/", capture_output=True
        )
        assert done.returncode == 0, done.stderr.decode()
    assert (tmp_path / "verifier" / "reward.json").read_text() == '{"reward": 1.0}'


def test_bundles_are_content_addressed(project: Any, tmp_path: Path) -> None:
    root, flow = project
    first = build_bundle(project=root, workflow=flow.Flow, cache_dir=tmp_path / "cache")
    again = build_bundle(project=root, workflow=flow.Flow, cache_dir=tmp_path / "cache")
    assert again == first
    (root / "pkg" / "words.py").write_text("WORD = 'changed'\n")
    changed = build_bundle(project=root, workflow=flow.Flow, cache_dir=tmp_path / "cache")
    assert changed.digest != first.digest and changed.wheel.exists()


def test_a_class_outside_the_project_is_refused(project: Any, tmp_path: Path) -> None:
    _, flow = project
    with pytest.raises(ConfigError, match="not a directory"):
        build_bundle(project=tmp_path / "missing", workflow=flow.Flow)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(ConfigError, match="outside the project"):
        build_bundle(project=elsewhere, workflow=flow.Flow, cache_dir=tmp_path / "c")


def test_a_grader_only_bundle_needs_no_workflow_in_the_project(
    project: Any, tmp_path: Path
) -> None:
    root, flow = project
    bundle = build_bundle(project=root, grader=flow.Judge, cache_dir=tmp_path / "c")
    assert bundle.wheel.exists()
