"""Every relative link of the README and the docs reaches a file, and every anchor a heading
(GitHub's slug of it) or an ``<a id>`` of that file: pages moved or split leave no dead link."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("examples/*/README.md"),
     *ROOT.glob("benchmarks/README.md")]
)  # fmt: skip
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = github_slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if not count else f"{slug}-{count}")
    found.update(re.findall(r'<a id="([^"]+)"', text))
    return frozenset(found)


def _links(path: Path) -> list[str]:
    text = _CODE.sub("", _FENCE.sub("", path.read_text(encoding="utf-8")))
    return [m for m in _LINK.findall(text) if not m.startswith(("http://", "https://", "mailto:"))]


def test_github_slugs_drop_punctuation_and_keep_underscores() -> None:
    assert github_slug("The loss (`osmosis_ai.train.grpo`)") == "the-loss-osmosis_aitraingrpo"
    assert github_slug("5. Change a setting") == "5-change-a-setting"


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for page in PAGES:
        for link in _links(page):
            target, _, anchor = link.partition("#")
            path = (page.parent / target).resolve() if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such anchor)")
    assert not broken, "\n".join(broken)
