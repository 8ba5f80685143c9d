"""The viewer's JSON API over a real training run (`osmosis train run`), by a real server."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import pytest_asyncio

from osmosis_ai.eval.run_dir import run_lock
from osmosis_ai.viewer import Viewer
from tests.viewer.conftest import TRAIN_RUN, copy_run, read_lines

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]


@pytest.fixture(scope="module")
def workspace_runs(
    train_run_root: Path, finished_run_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A workspace's ``.osmosis``: the finished eval run and the training run, side by side."""
    root = tmp_path_factory.mktemp("both") / ".osmosis"
    copy_run(finished_run_root / "finished", root / "evals")
    copy_run(train_run_root / "train" / TRAIN_RUN, root / "train")
    return root


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(workspace_runs: Path) -> AsyncIterator[httpx2.AsyncClient]:
    async with (
        Viewer(workspace_runs) as viewer,
        httpx2.AsyncClient(base_url=viewer.served_url, timeout=30) as client,
    ):
        yield client


def _run_dir(workspace_runs: Path) -> Path:
    return workspace_runs / "train" / TRAIN_RUN


def _evals(run_dir: Path) -> list[dict[str, Any]]:
    # One sample per held-out row: no pass@k points.
    return [
        {**{key: e[key] for key in ("step", "pass_rate", "mean_reward")}, "pass_at_k": []}
        for e in read_lines(run_dir / "events.jsonl")
        if e["event"] == "eval"
    ]


async def _get(http: httpx2.AsyncClient, path: str) -> Any:
    response = await http.get(path)
    assert response.status_code == 200, (path, response.text)
    return response.json()


async def test_training_runs_are_listed_beside_eval_runs(
    http: httpx2.AsyncClient, workspace_runs: Path, tiny_model_dir: Path
) -> None:
    run_dir = _run_dir(workspace_runs)
    metrics, evals = read_lines(run_dir / "metrics.jsonl"), _evals(run_dir)
    (eval_run,) = await _get(http, "/api/runs")
    assert eval_run["name"] == "finished" and eval_run["status"] == "finished"
    (listed,) = await _get(http, "/api/train")
    assert listed["name"] == TRAIN_RUN and listed["status"] == "finished"
    assert (listed["steps_done"], listed["steps_total"]) == (3, 3)
    assert listed["last_reward"] == metrics[-1]["reward_mean"]
    assert [e["step"] for e in evals] == [0, 2, 3]
    assert listed["held_out_before"] == evals[0] and listed["held_out_after"] == evals[-1]
    assert listed["model"] == str(tiny_model_dir)


async def test_the_run_page_has_every_step_and_held_out_point(
    http: httpx2.AsyncClient, workspace_runs: Path
) -> None:
    run_dir = _run_dir(workspace_runs)
    overview = await _get(http, f"/api/train/{TRAIN_RUN}")
    assert overview["metrics"] == read_lines(run_dir / "metrics.jsonl")
    assert overview["evals"] == _evals(run_dir)
    assert overview["kl_beta"] == 0.0  # its KL chart gives way to the engine's mismatch
    for line in overview["metrics"]:
        assert isinstance(line["loss"], float) and isinstance(line["kl"], float)


async def test_a_steps_rollouts_are_listed_and_each_opens_its_trajectory(
    http: httpx2.AsyncClient, workspace_runs: Path
) -> None:
    run_dir = _run_dir(workspace_runs)
    on_disk = sorted(
        p.name
        for p in (run_dir / "rollouts").iterdir()
        if p.name.startswith(("step-0002-", "eval-0002-"))
    )
    assert len(on_disk) == 2 * 3 + 2  # prompts × group size, then the two held-out rows
    listed = await _get(http, f"/api/train/{TRAIN_RUN}/steps/2")
    assert sorted(item["rollout_id"] for item in listed) == on_disk
    assert [item["kind"] for item in listed] == ["train"] * 6 + ["held-out"] * 2
    for item in listed:
        detail = await _get(http, f"/api/train/{TRAIN_RUN}/rollouts/{item['rollout_id']}")
        trajectory = detail["trajectory"]
        assert [step["source"] for step in trajectory["steps"]] == ["user", "agent"]
        assert item["status"] == "success" and item["tokens"] > 0
        assert item["reward"] == trajectory["extra"]["osmosis"]["reward"]
        assert detail["item"] == item
    assert await _get(http, f"/api/train/{TRAIN_RUN}/steps/9") == []


@pytest.mark.parametrize(
    "path",
    [
        "/api/train/nope",
        "/api/train/finished",  # an eval run is not a training run
        "/api/runs/tiny",  # nor the other way round
        "/api/train/..%2F..",
        f"/api/train/{TRAIN_RUN}/steps/two",
        f"/api/train/{TRAIN_RUN}/rollouts/..%2Fevents.jsonl",
        f"/api/train/{TRAIN_RUN}/rollouts/not-a-rollout",
        f"/api/train/{TRAIN_RUN}/rollouts/step-0001-row-0-0/artifacts/..%2F..%2Fevents.jsonl",
    ],
)
async def test_unknown_or_crafted_names_are_not_found(http: httpx2.AsyncClient, path: str) -> None:
    response = await http.get(path)
    assert response.status_code == 404, response.text


def _copy(workspace_runs: Path, root: Path) -> Path:
    return copy_run(_run_dir(workspace_runs), root / "train")


async def _overview(root: Path) -> dict[str, Any]:
    async with Viewer(root) as viewer, httpx2.AsyncClient(base_url=viewer.served_url) as client:
        return dict(await _get(client, f"/api/train/{TRAIN_RUN}"))


async def test_a_half_written_last_line_is_skipped(workspace_runs: Path, tmp_path: Path) -> None:
    run_dir = _copy(workspace_runs, tmp_path)
    for name in ("metrics.jsonl", "events.jsonl", "rollouts.jsonl"):
        with (run_dir / name).open("a") as file:
            file.write('{"step": 4, "reward_mean": 0.')  # the runner is writing this line
    overview = await _overview(tmp_path)
    assert [line["step"] for line in overview["metrics"]] == [1, 2, 3]
    assert overview["status"] == "finished" and overview["steps_done"] == 3


async def test_a_damaged_line_before_the_last_makes_the_run_broken(
    workspace_runs: Path, tmp_path: Path
) -> None:
    run_dir = _copy(workspace_runs, tmp_path)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:20]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    overview = await _overview(tmp_path)
    assert overview["status"] == "broken"
    assert overview["problem"] == "metrics.jsonl line 2 is not a JSON object"


def _cut_after_step(run_dir: Path, step: int) -> None:
    """The run as it was after ``step`` was applied, before it went on."""
    for name in ("metrics.jsonl", "events.jsonl"):
        lines = read_lines(run_dir / name)
        if name == "events.jsonl":  # up to and with the step's line
            last = next(
                i for i, e in enumerate(lines) if (e["event"], e.get("step")) == ("step", step)
            )
            lines = lines[: last + 1]
        else:
            lines = [line for line in lines if line["step"] <= step]
        (run_dir / name).write_text("".join(json.dumps(x) + "\n" for x in lines))


async def test_a_run_is_running_while_it_holds_its_lock_and_stopped_once_not(
    workspace_runs: Path, tmp_path: Path
) -> None:
    run_dir = _copy(workspace_runs, tmp_path)
    _cut_after_step(run_dir, 1)
    with run_lock(run_dir.parent, TRAIN_RUN):
        running = await _overview(tmp_path)
    assert running["status"] == "running"
    assert (running["steps_done"], running["steps_total"]) == (1, 3)
    assert running["held_out_after"] is None  # only the evaluation before training so far
    interrupted = await _overview(tmp_path)  # killed: no lock, not finished
    assert interrupted["status"] == "stopped"
    with (run_dir / "events.jsonl").open("a") as file:
        file.write(json.dumps({"event": "stopped", "step": 2, "reason": "non-finite loss"}) + "\n")
    assert (await _overview(tmp_path))["status"] == "stopped"


# ---- a token off loopback -------------------------------------------------------------------

TOKEN = "a-test-token-of-the-training-viewer-0123"


async def test_without_the_token_the_training_routes_are_refused(workspace_runs: Path) -> None:
    rollout_id = "step-0001-row-0-0"
    paths = [
        "/api/train",
        f"/api/train/{TRAIN_RUN}",
        f"/api/train/{TRAIN_RUN}/steps/1",
        f"/api/train/{TRAIN_RUN}/rollouts/{rollout_id}",
    ]
    async with (
        Viewer(workspace_runs, token=TOKEN) as viewer,
        httpx2.AsyncClient(base_url=viewer.served_url) as client,
    ):
        steps = await client.get(paths[2], headers={"Authorization": f"Bearer {TOKEN}"})
        assert rollout_id in [item["rollout_id"] for item in steps.json()]
        for path in paths:
            refused = await client.get(path)
            assert refused.status_code == 401, path
            assert "token" in refused.json()["detail"] and "reward" not in refused.text
            wrong = await client.get(path, headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401, path
            allowed = await client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert allowed.status_code == 200, path


async def test_training_rollout_artifacts_are_served_as_downloads(
    workspace_runs: Path, tmp_path: Path
) -> None:
    run_dir = _copy(workspace_runs, tmp_path)
    # A rollout that wrote no artifact keeps no artifacts/ folder: this one writes one.
    artifacts = run_dir / "rollouts" / "step-0001-row-0-0" / "artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "notes.txt").write_text("<script>no</script>")
    shutil.copy(artifacts / "notes.txt", tmp_path / "outside.txt")
    (artifacts / "escape").symlink_to(tmp_path)
    async with Viewer(tmp_path) as viewer, httpx2.AsyncClient(base_url=viewer.served_url) as c:
        base = f"/api/train/{TRAIN_RUN}/rollouts/step-0001-row-0-0"
        detail = await _get(c, base)
        served = await c.get(f"{base}/artifacts/notes.txt")
        escaped = await c.get(f"{base}/artifacts/escape/outside.txt")
    assert [a["path"] for a in detail["artifacts"]] == ["notes.txt"]
    assert served.status_code == 200 and served.text == "<script>no</script>"
    assert served.headers["content-disposition"].startswith("attachment")
    assert escaped.status_code == 404


async def test_a_run_of_before_the_config_sections_still_shows_its_kl(tmp_path: Path) -> None:
    """Runs written by 0.3 journaled their settings flat, as ``training``."""
    from osmosis_ai.viewer.training import train_overview

    run_dir = tmp_path / "old"
    run_dir.mkdir()
    start = {"event": "start", "step": 0, "steps": 2, "model": "m", "training": {"kl_beta": 0.1}}
    (run_dir / "events.jsonl").write_text(json.dumps(start) + "\n")
    (run_dir / "metrics.jsonl").write_text("")
    assert train_overview(run_dir)["kl_beta"] == 0.1
