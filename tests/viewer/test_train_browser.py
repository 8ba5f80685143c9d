"""The viewer's training pages in headless Chromium, over a real training run."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page

from osmosis_ai.eval.run_dir import run_lock
from osmosis_ai.viewer import Viewer
from tests.viewer.conftest import TRAIN_RUN, copy_run, read_lines

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

#: The four curves of the run page: chart title and the metrics key it draws. The tiny run
#: has no KL penalty (its KL is 0 throughout): its fourth chart is the engine's mismatch.
CHARTS = {
    "reward": "reward_mean",
    "pass rate": "pass_rate",
    "loss": "loss",
    "engine/learner mismatch (KL)": "engine_mismatch_kl",
}


async def _points(page: Page, chart: str) -> tuple[int, int]:
    """The number of dots of ``chart`` and of vertices of its line."""
    svg = page.locator(f'svg[aria-label="{chart}"]')
    line = await svg.locator("polyline").get_attribute("points")
    return await svg.locator("circle.dot").count(), len((line or "").split())


async def _open_run(page: Page, url: str) -> None:
    await page.goto(f"{url}#/train/{TRAIN_RUN}")
    await page.wait_for_selector("#train-steps tbody tr")


async def test_the_run_page_draws_a_point_per_step_and_marks_held_out_points(
    page: Page, train_run_root: Path
) -> None:
    run_dir = train_run_root / "train" / TRAIN_RUN
    metrics = read_lines(run_dir / "metrics.jsonl")
    evals = [e for e in read_lines(run_dir / "events.jsonl") if e["event"] == "eval"]
    async with Viewer(train_run_root) as viewer:
        await _open_run(page, viewer.url)
        for chart, key in CHARTS.items():
            steps = [m for m in metrics if isinstance(m[key], float | int)]
            assert len(steps) == 3, key  # every step of the tiny run has each value
            assert await _points(page, chart) == (len(steps), len(steps)), chart
        assert await page.locator('svg[aria-label="KL"]').count() == 0
        for chart in ("pass rate", "reward"):  # held-out pass rate and mean reward, as rings
            marks = page.locator(f'svg[aria-label="{chart}"] circle.mark title')
            titles = await marks.all_text_contents()
            assert [t.split(":")[0] for t in titles] == [
                f"held-out after step {e['step']}" for e in evals
            ]
        assert await page.locator("svg circle.mark").count() == 2 * len(evals)
        cards = await _cards(page)
        before, after = evals[0], evals[-1]
        assert cards["held-out mean reward"] == (
            f"{_fixed(before['mean_reward'])} → {_fixed(after['mean_reward'])}"
        )
        assert cards["held-out pass rate"].count("%") == 2
        assert not any(label.startswith("held-out pass@") for label in cards)
        rows = page.locator("#train-steps tbody tr")
        assert [await r.get_attribute("data-step") for r in await rows.all()] == ["1", "2", "3"]
        # The run records asynchronous training's figures (synchronous here: nothing stale).
        headers = await page.locator("#train-steps thead th").all_inner_texts()
        assert {"stale max", "groups waited", "learner idle", "engine idle"} <= set(headers)
        stale = headers.index("stale max")
        cells = [await r.locator("td").nth(stale).inner_text() for r in await rows.all()]
        assert cells == ["0", "0", "0"]


def _fixed(value: float) -> str:
    """A number as the page writes it (``fmt``: integers as they are, else 3 decimals)."""
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}"


async def _cards(page: Page) -> dict[str, str]:
    labels = await page.locator(".cards .label").all_inner_texts()
    values = await page.locator(".cards .value").all_inner_texts()
    return {label.lower(): value for label, value in zip(labels, values, strict=True)}


async def test_a_kl_penalty_draws_kl_and_several_samples_draw_pass_at_k(
    page: Page, train_run_root: Path, tmp_path: Path
) -> None:
    run_dir = copy_run(train_run_root / "train" / TRAIN_RUN, tmp_path / "train")
    events = read_lines(run_dir / "events.jsonl")
    for event in events:  # as a run with kl_beta > 0 and [eval] samples = 3 journals them
        if event["event"] == "start":
            event["settings"]["algorithm"]["kl_beta"] = 0.05
        elif event["event"] == "eval":
            event["pass_at_k"] = {"1": 0.25, "2": 0.5, "3": 0.75}
    _write(run_dir / "events.jsonl", events)
    async with Viewer(tmp_path) as viewer:
        await _open_run(page, viewer.url)
        assert await _points(page, "KL") == (3, 3)
        assert await page.locator('svg[aria-label^="engine/learner"]').count() == 0
        last = [e for e in events if e["event"] == "eval"][-1]["step"]
        chart = page.locator(f'svg[aria-label="held-out pass@k (after step {last})"]')
        tips = await chart.locator("circle.dot title").all_text_contents()
        assert tips == ["pass@1 = 25.0%", "pass@2 = 50.0%", "pass@3 = 75.0%"]
        assert (await _cards(page))["held-out pass@3"] == "75.0% → 75.0%"


async def test_clicking_a_step_lists_its_rollouts_and_one_shows_its_trajectory(
    page: Page, train_run_root: Path
) -> None:
    lines = read_lines(train_run_root / "train" / TRAIN_RUN / "rollouts.jsonl")
    of_step = [x for x in lines if x["rollout_id"].startswith(("step-0002-", "eval-0002-"))]
    async with Viewer(train_run_root) as viewer:
        await _open_run(page, viewer.url)
        await page.locator('#train-steps tr[data-step="2"]').click()
        await page.wait_for_selector("#rollouts tbody tr")
        shown = await page.locator("#rollouts tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.rollout)"
        )
        assert sorted(shown) == sorted(x["rollout_id"] for x in of_step)
        first = next(x for x in of_step if x["rollout_id"] == shown[0])
        await page.locator("#rollouts tbody tr").first.click()
        await page.wait_for_selector("#steps .step")
        sources = await page.locator("#steps .step .src").all_inner_texts()
        assert [s.lower() for s in sources] == ["user", "agent"]
        cards = await _cards(page)
        assert cards["status"] == "success"
        assert float(cards["reward"]) == pytest.approx(first["reward"], abs=1e-3)
        assert "step 2" in await page.locator("#crumbs").inner_text()


async def test_the_runs_page_lists_the_training_run(page: Page, train_run_root: Path) -> None:
    async with Viewer(train_run_root) as viewer:
        await page.goto(viewer.url)
        row = page.locator(f'#train-runs tr[data-run="{TRAIN_RUN}"]')
        await row.wait_for()
        assert await row.locator(".steps").inner_text() == "3 / 3"
        assert await row.locator(".status-finished").inner_text() == "finished"
        assert "→" in await row.locator(".held-out").inner_text()
        reward = await row.locator(".held-out-reward").inner_text()
        assert re.fullmatch(r"[-0-9.]+ → [-0-9.]+", reward), reward
        await row.locator("a").click()
        await page.wait_for_selector("#train-steps")


def _write(path: Path, lines: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


async def test_a_live_run_grows_its_curves(
    page: Page, train_run_root: Path, tmp_path: Path
) -> None:
    source = train_run_root / "train" / TRAIN_RUN
    run_dir = copy_run(source, tmp_path / "train")
    metrics, events = read_lines(source / "metrics.jsonl"), read_lines(source / "events.jsonl")
    first_step = next(i for i, e in enumerate(events) if (e["event"], e.get("step")) == ("step", 1))
    _write(run_dir / "metrics.jsonl", metrics[:1])
    _write(run_dir / "events.jsonl", events[: first_step + 1])
    async with Viewer(tmp_path) as viewer:
        with run_lock(run_dir.parent, TRAIN_RUN):  # as the runner holds it
            await _open_run(page, viewer.url)
            assert await page.locator("h1 .pill").inner_text() == "running"
            assert await _points(page, "reward") == (1, 1)
            # The runner goes on: the rest of the real run's lines, as it wrote them.
            await asyncio.to_thread(shutil.copy, source / "metrics.jsonl", run_dir)
            async with asyncio.timeout(20):
                while await _points(page, "reward") != (3, 3):  # noqa: ASYNC110 -- the page polls
                    await asyncio.sleep(0.2)
            assert await page.locator("#train-steps tbody tr").count() == 3
            await asyncio.to_thread(shutil.copy, source / "events.jsonl", run_dir)
        # The runner ended: its lock is free and its last held-out evaluation journaled.
        pill = page.locator("h1 .pill")
        async with asyncio.timeout(20):
            while await pill.inner_text() != "finished":  # noqa: ASYNC110 -- the page polls
                await asyncio.sleep(0.2)
        held_out = page.locator('svg[aria-label="pass rate"] circle.mark')
        assert await held_out.count() == len([e for e in events if e["event"] == "eval"])


async def test_the_page_waits_for_a_run_that_has_not_started_yet(
    page: Page, train_run_root: Path, tmp_path: Path
) -> None:
    (tmp_path / "train").mkdir()
    async with Viewer(tmp_path) as viewer:  # --view serves before the run's first line
        await page.goto(f"{viewer.url}#/train/{TRAIN_RUN}")
        await page.wait_for_selector("#waiting")
        await asyncio.to_thread(copy_run, train_run_root / "train" / TRAIN_RUN, tmp_path / "train")
        await page.wait_for_selector("#train-steps tbody tr", timeout=10_000)
        assert await page.locator("#train-steps tbody tr").count() == 3
