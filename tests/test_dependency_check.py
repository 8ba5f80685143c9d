"""scripts/check_dependencies.py: every import is declared by the extra its file runs with."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_dependencies.py"

PYPROJECT = """\
[project]
name = "probe-project"
version = "0"
dependencies = ["pydantic>=2"]

[project.optional-dependencies]
web = ["starlette>=0.40"]
full = ["probe-project[web]", "aiohttp>=3"]

[tool.osmosis.dependency-check]
roots = ["src"]
first-party = ["probe"]

[tool.osmosis.dependency-check.extras]
"src/probe/web/" = ["web"]
"src/probe/web/both.py" = ["web", "full"]
"src/probe/web/together.py" = ["web+full"]
"""


def _project(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    for name, text in files.items():
        path = tmp_path / "src" / "probe" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def _check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_finding(root: Path) -> str:
    """The check's only finding under ``root`` (it must fail, with that line and its count)."""
    result = _check(root)
    assert result.returncode == 1, result.stdout + result.stderr
    (finding, summary) = result.stdout.splitlines()
    assert summary == "dependency check: 1 undeclared imports in 1 files"
    return finding


def test_the_project_declares_every_import() -> None:
    result = _check(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is declared" in result.stdout


def test_declared_imports_pass(tmp_path: Path) -> None:
    root = _project(
        tmp_path,
        {
            "core.py": """\
                from typing import TYPE_CHECKING
                import json
                import pydantic
                from probe import web
                from . import helpers
                if TYPE_CHECKING:
                    import starlette  # only the type checker reads it
                try:
                    import uvloop  # optional by construction
                except ImportError:
                    uvloop = None
                """,
            "web/app.py": "import starlette\nimport pydantic\nfrom sibling import x\n",
            "web/sibling.py": "x = 1\n",
            "web/together.py": "import starlette, aiohttp\n",
        },
    )
    result = _check(root)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_undeclared_import_fails_with_its_line_and_fix(tmp_path: Path) -> None:
    root = _project(tmp_path, {"core.py": "import json\n\n\ndef late():\n    import aiohttp\n"})
    finding = _one_finding(root)
    assert finding.startswith("src/probe/core.py:5: imports aiohttp (distribution aiohttp)")
    assert "not declared in the base dependencies" in finding
    assert finding.endswith("add it to [project] dependencies")


def test_an_import_another_package_pulls_in_does_not_count(tmp_path: Path) -> None:
    # anyio is installed here (starlette requires it) but [web] does not name it.
    root = _project(tmp_path, {"web/app.py": "import starlette\nimport anyio\n"})
    finding = _one_finding(root)
    assert finding.startswith("src/probe/web/app.py:2: imports anyio")
    assert "not declared in [web]; here it comes only with" in finding
    assert "starlette" in finding.split("comes only with", 1)[1]
    assert finding.endswith("declare it in [web]")


def test_each_alternative_installation_must_declare_it(tmp_path: Path) -> None:
    # both.py runs with [web] alone or with [full] alone: aiohttp is only in [full].
    root = _project(tmp_path, {"web/both.py": "import starlette\nimport aiohttp\n"})
    finding = _one_finding(root)
    assert "imports aiohttp (distribution aiohttp), not declared in [web]" in finding


def test_import_optional_is_checked_against_the_extra_it_names(tmp_path: Path) -> None:
    root = _project(
        tmp_path,
        {
            "core.py": """\
                from probe._extras import import_optional
                import_optional("starlette", extra="web", feature="serving")
                import_optional("aiohttp", extra="web", feature="calls")
                """
        },
    )
    finding = _one_finding(root)
    assert finding.startswith("src/probe/core.py:3: imports aiohttp")
    assert "not declared in [web]" in finding


def test_an_unknown_extra_in_the_table_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT.replace('["web+full"]', '["webb"]'))
    result = _check(tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "dependency check: pyproject.toml: [tool.osmosis.dependency-check.extras] "
        "'src/probe/web/together.py' names the extra 'webb', which "
        "[project.optional-dependencies] does not declare"
    )
