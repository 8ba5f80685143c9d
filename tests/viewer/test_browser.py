"""The viewer page in headless Chromium (Debian's ``chromium``, driven by Playwright)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page

from osmosis_ai.viewer import Viewer
from tests.viewer.conftest import FAILURE, chatty_workspace, copy_run, read_line

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def viewer_url(finished_run_root: Path) -> AsyncIterator[str]:
    async with Viewer(finished_run_root) as viewer:
        yield viewer.url


async def _open_item(page: Page, viewer_url: str, row_selector: str) -> None:
    await page.goto(f"{viewer_url}#/run/finished")
    await page.locator(row_selector).first.click()
    await page.wait_for_selector("#steps .step")


async def test_failed_item_shows_its_error_and_steps(page: Page, viewer_url: str) -> None:
    await page.goto(f"{viewer_url}#/run/finished")
    await page.wait_for_selector("#items tbody tr")
    assert await page.locator("#items tbody tr").count() == 3
    await page.select_option("#status-filter", "failed")
    assert await page.locator("#items tbody tr").count() == 1
    await page.locator("#items tbody tr").first.click()
    error = page.locator("#error")
    await error.wait_for()
    assert "agent_error" in await error.inner_text()
    assert FAILURE in await error.inner_text()
    # The message the journal recorded, also when no diagnostics were written.
    assert FAILURE in await error.locator(".error-message").inner_text()
    await page.wait_for_selector("#steps .step")
    assert await page.locator("#steps .step").count() >= 2


async def test_markup_in_messages_renders_as_text(page: Page, viewer_url: str) -> None:
    await _open_item(page, viewer_url, "#items tbody tr[data-rollout] >> nth=2")
    text = await page.locator("#steps").inner_text()
    assert '<img src=x onerror="window.__xss=1">' in text
    assert "<script>window.__xss=2</script>" in text
    assert await page.evaluate("window.__xss") is None
    assert await page.locator("#steps img, #steps script").count() == 0


async def test_trajectory_page_lists_and_serves_artifacts(page: Page, viewer_url: str) -> None:
    await _open_item(page, viewer_url, "#items tbody tr[data-rollout] >> nth=0")
    link = page.locator("#artifacts a")
    assert await link.inner_text() == "notes.txt"
    async with page.expect_download() as info:
        await link.click()
    download = await info.value
    saved = Path(await download.path())
    assert await asyncio.to_thread(saved.read_text) == "hello from an artifact"


async def test_a_turn_reward_shows_on_the_agent_step_of_its_model_call(
    page: Page, viewer_url: str
) -> None:
    await _open_item(page, viewer_url, "#items tbody tr[data-rollout] >> nth=0")
    steps = page.locator("#steps .step.source-agent")
    assert await steps.count() == 2
    assert await steps.nth(0).locator(".turn-reward").count() == 0
    assert await steps.nth(1).locator(".turn-reward").inner_text() == "turn reward 0.250"


async def test_dot_dot_artifact_paths_are_refused(page: Page, viewer_url: str) -> None:
    await page.goto(f"{viewer_url}#/run/finished")
    rollout_id = await page.locator("#items tbody tr[data-rollout]").first.get_attribute(
        "data-rollout"
    )
    base = f"{viewer_url}api/runs/finished/rollouts/{rollout_id}/artifacts/"
    for crafted in ("..%2F..%2Fmanifest.json", "%2E%2E/%2E%2E/manifest.json"):
        response = await page.goto(base + crafted)
        assert response is not None and response.status == 404
        assert "local_run_id" not in await page.content()


async def test_running_eval_preview_gains_steps(page: Page, tmp_path: Path) -> None:
    async with chatty_workspace(tmp_path / "ws") as workspace:
        workspace.write_rows(
            [
                {
                    "user_prompt": "say token0",
                    "ground_truth": "token0",
                    "metadata": {"turns": 12, "pause": 0.5},
                }
            ]
        )
        process = await workspace.start("--name", "live", "--view")
        try:
            assert process.stdout is not None
            match = await read_line(process.stdout, re.compile(r"viewer: (http://\S+)"))
            await page.goto(match.group(1))
            steps = page.locator("#live .live .steps")
            await steps.first.wait_for(timeout=30_000)
            first = int((await steps.first.inner_text()).split()[0])
            async with asyncio.timeout(30):
                while int((await steps.first.inner_text()).split()[0]) <= first:  # noqa: ASYNC110 -- the page changes, not an event of ours
                    await asyncio.sleep(0.3)
            await read_line(process.stdout, re.compile("viewer stays up"))
        finally:
            process.send_signal(signal.SIGINT)
            async with asyncio.timeout(30):
                await process.wait()
    assert process.returncode == 0


async def test_a_damaged_run_is_listed_as_broken_and_its_page_says_why(
    page: Page, damaged_root: Path
) -> None:
    async with Viewer(damaged_root) as viewer:
        await page.goto(viewer.url)
        await page.wait_for_selector("#runs tbody tr")
        assert await page.locator("#runs tbody tr").count() == 4
        broken = page.locator('#runs tr[data-run="bad-journal"] .status-broken')
        assert "broken" in await broken.inner_text()
        assert "line 4 is not a valid record" in await broken.inner_text()
        healthy = page.locator('#runs tr[data-run="finished"] .status-finished')
        assert await healthy.inner_text() == "finished"
        await page.locator('#runs tr[data-run="bad-journal"] a').click()
        problem = page.locator("#problem")
        await problem.wait_for()
        assert "line 4 is not a valid record" in await problem.inner_text()


async def _cards(page: Page) -> dict[str, str]:
    await page.wait_for_selector(".cards .card")
    labels = await page.locator(".cards .card .label").all_inner_texts()
    values = await page.locator(".cards .card .value").all_inner_texts()
    return {label.lower(): value for label, value in zip(labels, values, strict=True)}


async def test_cards_fill_from_the_journal_while_the_run_goes_on(
    page: Page, repeated_run_root: Path, tmp_path: Path
) -> None:
    live = copy_run(repeated_run_root / "repeated", tmp_path / "evals", live=True)
    async with Viewer(live.parent) as viewer:
        await page.goto(f"{viewer.url}#/run/repeated")
        await page.wait_for_selector("#items tbody tr")
        assert await page.locator("h1 .pill").inner_text() == "running"
        cards = await _cards(page)
    assert cards["pass rate"] == "100.0%" and cards["mean reward"] == "1"
    assert cards["items"] == "4" and int(cards["tokens"]) > 0


async def test_pass_at_k_labels_stay_inside_the_chart(page: Page, repeated_run_root: Path) -> None:
    async with Viewer(repeated_run_root) as viewer:
        await page.goto(f"{viewer.url}#/run/repeated")
        chart = page.locator('svg[aria-label="pass@k"]')
        await chart.wait_for()
        box = await chart.bounding_box()
        texts = chart.locator("text")
        labels = await texts.all_text_contents()
        assert labels.count("100.0%") == 3  # pass@1, 2 and 4
        for index in range(await texts.count()):
            inner = await texts.nth(index).bounding_box()
            assert box and inner, labels[index]
            assert inner["x"] >= box["x"] and inner["y"] >= box["y"], labels[index]
            assert inner["x"] + inner["width"] <= box["x"] + box["width"], labels[index]
            assert inner["y"] + inner["height"] <= box["y"] + box["height"], labels[index]


async def test_mean_reward_is_defined_beside_the_failed_items(page: Page, viewer_url: str) -> None:
    await page.goto(f"{viewer_url}#/run/finished")
    definitions = page.locator("#definitions")
    await definitions.wait_for()
    text = await definitions.inner_text()
    # FINISHED_ROWS: 3 items, the failing one has no reward: the mean is over the other 2.
    assert "mean reward = average reward of the 2 items that have one" in text
    assert "failed items without a reward (1 here) are left out, not counted as 0" in text
    assert "a failed item counts as not passed" in text
    cards = await _cards(page)
    assert cards["mean reward"] == "0.500" and cards["failed"] == "1"


async def test_the_token_link_lets_the_browser_in_and_nothing_else(
    browser: Browser, finished_run_root: Path
) -> None:
    async with Viewer(finished_run_root, token="a-browser-test-token-0123456789") as viewer:
        context = await browser.new_context()
        page = await context.new_page()
        await page.goto(f"{viewer.url}#/run/finished")  # the printed link, once
        await page.wait_for_selector("#items tbody tr")
        assert "token" not in page.url
        await page.goto(f"{viewer.served_url}/#/")  # the same viewer later: the cookie is kept
        await page.wait_for_selector("#runs tbody tr")
        await context.close()
        stranger = await browser.new_context()
        other = await stranger.new_page()
        response = await other.goto(f"{viewer.served_url}/#/run/finished")
        assert response is not None and response.status == 401
        assert "needs its token" in await other.inner_text("body")
        await stranger.close()


async def test_a_judges_verdict_shows_with_the_grade(
    page: Page, finished_run_root: Path, tmp_path: Path
) -> None:
    run = copy_run(finished_run_root / "finished", tmp_path / "evals")
    [trial] = [t for t in (run / "rollout_trials").iterdir() if (t / "artifacts").is_dir()][:1]
    verdict = {"score": 0.75, "range": [0, 1], "attempt": 2, "of": 3, "reasoning": "<b>close</b>"}
    (trial / "group_judge.json").write_text(json.dumps(verdict))
    async with Viewer(run.parent) as viewer:
        await page.goto(f"{viewer.url}#/run/finished")
        await page.locator(f'#items tbody tr[data-rollout="{trial.name}"]').click()
        judges = page.locator("#judges")
        await judges.wait_for()
        text = await judges.inner_text()
    assert "group judge · score 0.750 of [0, 1] · attempt 2 of 3" in text
    assert "<b>close</b>" in text  # the judge's words render as text
