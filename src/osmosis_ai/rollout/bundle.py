"""Bundles: a user project as a content-addressed wheel that runs in a container.

``build_bundle`` copies the project's files into a package ``osmosis_bundle_<digest>``
together with a spec of the workflow, grader and configs (`_spec`), and writes it as a
pure-Python wheel. Inside a container, ``python -m osmosis_bundle_<digest>.agent`` and
``... .grade`` run the two phases through the in-container runner
(`osmosis_ai.rollout.container`); the image needs Python and ``osmosis-ai``, nothing else —
not even pip (``python -m zipfile -e bundle.whl DIR`` unpacks it; ``pip install`` works too).

The digest covers every file, the spec and the osmosis version, so an unchanged project
reuses its cached wheel and any edit gives a new one.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import io
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Unpack

from osmosis_ai import __version__
from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout.backend.spec import dump_spec, load_spec
from osmosis_ai.rollout.spec import RolloutSpec, SpecKeywords, spec_argument
from osmosis_ai.rollout.storage import atomic_write_bytes

__all__ = ["Bundle", "build_bundle", "run_bundle"]

#: Largest project (sum of file sizes) a bundle takes.
MAX_PROJECT_BYTES = 64 * 1024 * 1024

# Besides these, every directory whose name starts with a dot (.git, .venv, caches...).
_SKIPPED_DIRS = frozenset({"venv", "__pycache__", "node_modules", "build", "dist"})
_SKIPPED_SUFFIXES = (".pyc", ".pyo")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed: same files, same bytes


@dataclass(frozen=True)
class Bundle:
    """A built bundle."""

    wheel: Path
    """The wheel file."""
    package: str
    """Its top-level package: run ``python -m <package>.agent`` / ``<package>.grade``."""
    digest: str
    """Hex SHA-256 of the contents."""

    def command(self, phase: str, python: str = "python3") -> str:
        """The shell command running ``phase`` (``agent`` or ``grade``) once unpacked."""
        return f"{python} -m {self.package}.{phase}"


def _project_files(root: Path) -> list[tuple[str, bytes]]:
    files: list[tuple[str, bytes]] = []
    total = 0
    for directory, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in _SKIPPED_DIRS and not d.startswith(".")
        )
        for name in sorted(filenames):
            path = Path(directory, name)
            if name.endswith(_SKIPPED_SUFFIXES) or path.is_symlink():
                continue
            data = path.read_bytes()
            total += len(data)
            if total > MAX_PROJECT_BYTES:
                raise ConfigError(
                    f"project {root} holds more than {MAX_PROJECT_BYTES // 2**20} MiB; pass "
                    "code_dir= pointing at the directory with just the rollout's code"
                )
            files.append((path.relative_to(root).as_posix(), data))
    return files


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def _wheel_bytes(package: str, entries: list[tuple[str, bytes]]) -> bytes:
    dist_info = f"{package}-0.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {package}\nVersion: 0\n"
    wheel = "Wheel-Version: 1.0\nGenerator: osmosis-ai\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries = [
        *entries,
        (f"{dist_info}/METADATA", metadata.encode()),
        (f"{dist_info}/WHEEL", wheel.encode()),
    ]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in entries)
    entries.append((f"{dist_info}/RECORD", f"{record}{dist_info}/RECORD,,\n".encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name, _ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return buffer.getvalue()


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base) if base else Path.home() / ".cache") / "osmosis" / "bundles"


def build_bundle(
    spec: RolloutSpec | None = None,
    *,
    project: Path | str,
    cache_dir: Path | str | None = None,
    **refs: Unpack[SpecKeywords],
) -> Bundle:
    """Build (or reuse from the cache) the wheel of ``project`` running these objects.

    Args:
        spec: The objects as a `RolloutSpec` (instead of the four keywords below).
        project: The directory the workflow's module is imported from.
        workflow: The ``AgentWorkflow`` class (``None`` for a grader-only bundle).
        workflow_config: Its config instance, if any.
        grader: The ``Grader`` class, if any.
        grader_config: Its config instance, if any.
        cache_dir: Where wheels are kept; default ``$XDG_CACHE_HOME/osmosis/bundles``
            (``~/.cache/...``).

    Raises:
        ConfigError: A class is not defined in ``project``, a config does not survive
            JSON, or the project is too large.
    """
    root = Path(project).resolve()
    if not root.is_dir():
        raise ConfigError(f"bundle project {root} is not a directory")
    resolved = spec_argument(spec, **refs)
    spec_json = dump_spec(resolved, root=root)
    files = _project_files(root)
    hasher = hashlib.sha256(f"osmosis-ai {__version__}\0".encode() + spec_json)
    for name, data in files:
        hasher.update(f"\0{name}\0{len(data)}\0".encode() + data)
    digest = hasher.hexdigest()
    package = f"osmosis_bundle_{digest[:16]}"
    wheel = Path(cache_dir or _cache_root()) / digest / f"{package}-0-py3-none-any.whl"
    if wheel.is_file():
        return Bundle(wheel, package, digest)
    launcher = "from osmosis_ai.rollout.bundle import run_bundle\n\nrun_bundle(__package__, {!r})\n"
    entries = [
        (f"{package}/__init__.py", b""),
        (f"{package}/spec.json", spec_json),
        (f"{package}/agent.py", launcher.format("agent").encode()),
        (f"{package}/grade.py", launcher.format("grade").encode()),
        *((f"{package}/project/{name}", data) for name, data in files),
    ]
    wheel.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(wheel, _wheel_bytes(package, entries))
    return Bundle(wheel, package, digest)


def run_bundle(package: str | None, phase: str) -> None:
    """Entry point of a bundle's ``agent``/``grade`` module: run the phase, then exit."""
    from osmosis_ai.rollout.container import agent_main, grader_main

    assert package is not None
    root = Path(importlib.import_module(package).__file__ or "").parent
    spec = load_spec((root / "spec.json").read_bytes(), root=root / "project")
    if phase == "agent":
        if spec.workflow is None:
            raise SystemExit("this bundle has no workflow")
        raise SystemExit(agent_main(spec.workflow, spec.workflow_config))
    if spec.grader is None:
        raise SystemExit("this bundle has no grader")
    raise SystemExit(grader_main(spec.grader, spec.grader_config))
