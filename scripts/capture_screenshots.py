"""Capture the docs' viewer screenshots through headless Chromium.

``python scripts/capture_screenshots.py [RUNS]``: RUNS defaults to
``examples/calculator/.osmosis/evals`` (run ``make demo`` first). The newest eval run's page
and the trajectory of its first rollout with a tool call are saved as
``docs/images/run.png`` and ``docs/images/trajectory.png``.

``python scripts/capture_screenshots.py --train [RUNS]``: RUNS defaults to
``examples/calculator/.osmosis`` (after ``osmosis train run``). The newest training run's
page, with its middle step's rollouts listed, is saved as ``docs/images/train.png``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

from playwright.async_api import async_playwright

from osmosis_ai.viewer import Viewer

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "docs" / "images"
DEFAULT_ROOT = REPO / "examples" / "calculator" / ".osmosis" / "evals"
DEFAULT_TRAIN_ROOT = REPO / "examples" / "calculator" / ".osmosis"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]  # fmt: skip


def _get(url: str) -> Any:
    with urllib.request.urlopen(url) as response:  # our own viewer, on 127.0.0.1
        return json.loads(response.read())


async def main(root: Path) -> None:
    async with Viewer(root) as viewer:
        api = f"{viewer.served_url}/api/runs"
        run = await asyncio.to_thread(_get, api)
        assert isinstance(run, list) and run, f"no eval run under {root}"
        name = run[0]["name"]
        items = await asyncio.to_thread(_get, f"{api}/{name}/items")
        assert isinstance(items, list)
        with_tools = None
        for item in items:
            detail = await asyncio.to_thread(_get, f"{api}/{name}/rollouts/{item['rollout_id']}")
            steps = ((detail or {}).get("trajectory") or {}).get("steps", [])
            if any(step.get("tool_calls") for step in steps):
                with_tools = item["rollout_id"]
                break
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path="/usr/bin/chromium", args=ARGS
            )
            page = await browser.new_page(viewport={"width": 1200, "height": 900})
            await page.goto(f"{viewer.url}#/run/{name}")
            await page.wait_for_selector("#items tbody tr")
            await page.screenshot(path=str(IMAGES / "run.png"))
            rollout_id = with_tools or items[0]["rollout_id"]
            await page.goto(f"{viewer.url}#/run/{name}/rollout/{rollout_id}")
            await page.wait_for_selector("#steps .step")
            await page.screenshot(path=str(IMAGES / "trajectory.png"))
            await browser.close()


async def train(root: Path) -> None:
    async with Viewer(root) as viewer:
        runs = await asyncio.to_thread(_get, f"{viewer.served_url}/api/train")
        assert isinstance(runs, list) and runs, f"no training run under {root}"
        name, steps = runs[0]["name"], runs[0]["steps_done"]
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path="/usr/bin/chromium", args=ARGS
            )
            page = await browser.new_page(viewport={"width": 1200, "height": 900})
            await page.goto(f"{viewer.url}#/train/{name}/step/{max(1, steps // 2)}")
            await page.wait_for_selector("#rollouts tbody tr")
            await page.screenshot(path=str(IMAGES / "train.png"), full_page=True)
            await browser.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--train"]:
        asyncio.run(train(Path(args[1]) if len(args) > 1 else DEFAULT_TRAIN_ROOT))
    else:
        asyncio.run(main(Path(args[0]) if args else DEFAULT_ROOT))
