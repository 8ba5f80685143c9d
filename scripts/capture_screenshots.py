"""Capture the README's viewer screenshots: ``python scripts/capture_screenshots.py [RUNS]``.

RUNS defaults to ``examples/calculator/.osmosis/evals`` (run ``make demo`` first). The
newest run's page and the trajectory of its first rollout with a tool call are saved as
``docs/images/run.png`` and ``docs/images/trajectory.png``, through headless Chromium.
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


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_ROOT))
