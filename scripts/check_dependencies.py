"""Check that every import is a declared dependency of the extra its code is installed with.

``python scripts/check_dependencies.py`` (part of ``make check``) reads the project's
``pyproject.toml``: the base dependencies, the extras (an extra that names
``<project>[other]`` includes ``other``), and ``[tool.osmosis.dependency-check]``, which says
which trees to read and which installations each file runs in: a path prefix (the longest
wins) to a list of alternatives, each an extra or extras installed together (``"train+track"``);
the file must work in every one of them. A path with no entry runs with the base dependencies
alone.

Every ``import`` and ``from ... import`` of a file, at module level or inside a function,
except under ``if TYPE_CHECKING:``, must name the standard library, the project itself, a
module beside the file, or a distribution that the base dependencies or the file's extras
declare by name. A distribution that is installed only because a declared one requires it
does not count: another release of that one may drop it, and a user's environment built from
the README then lacks it. ``import_optional("module", extra="name", ...)`` is checked against
the extra it names. An import inside ``try:`` whose ``except`` catches ``ImportError`` is
optional by construction and is not checked.

deptry checks a project's imports against its dependencies as one set; an import in the
evaluation code of a package declared only for training passes there and fails here.

Exits 1 with one line per finding (``path:line: ...``), 0 when there is none. ``--root DIR``
checks another project (the tests use it).
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Finding", "ProjectDependencies", "check", "main"]

BASE = "the base dependencies"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    match = _NAME.match(requirement.strip())
    if match is None:
        raise ValueError(f"pyproject.toml: cannot read the requirement {requirement!r}")
    return normalise(match.group(0))


@dataclass(frozen=True)
class ProjectDependencies:
    """What ``pyproject.toml`` declares, and which extras each path runs with."""

    name: str
    base: frozenset[str]
    extras: Mapping[str, frozenset[str]]
    """Extra -> every distribution it declares, its included extras' and the base's too."""
    roots: tuple[str, ...]
    first_party: frozenset[str]
    path_extras: Mapping[str, tuple[str, ...]]
    """Path prefix -> its installations, each ``extra`` or ``extra+extra``."""

    @classmethod
    def read(cls, root: Path) -> ProjectDependencies:
        data = tomllib.loads((root / "pyproject.toml").read_text())
        project = data["project"]
        name = normalise(project["name"])
        base = frozenset(_requirement_name(r) for r in project.get("dependencies", ()))
        declared: dict[str, list[str]] = project.get("optional-dependencies", {})
        settings = data.get("tool", {}).get("osmosis", {}).get("dependency-check", {})
        path_extras = {
            prefix: tuple(extras) for prefix, extras in settings.get("extras", {}).items()
        }
        for prefix, installations in path_extras.items():
            for extra in (e for i in installations for e in i.split("+")):
                if extra not in declared:
                    raise ValueError(
                        f"pyproject.toml: [tool.osmosis.dependency-check.extras] {prefix!r} "
                        f"names the extra {extra!r}, which [project.optional-dependencies] "
                        "does not declare"
                    )
        return cls(
            name=name,
            base=base,
            extras={extra: base | _closure(extra, declared, name) for extra in declared},
            roots=tuple(settings.get("roots", ("src",))),
            first_party=frozenset(settings.get("first-party", ())),
            path_extras=path_extras,
        )

    def installations(self, relative: str) -> list[tuple[str, frozenset[str]]]:
        """Each installation a file (its path relative to the root, with ``/``) must work in:
        its label and the distributions it declares."""
        matches = [prefix for prefix in self.path_extras if relative.startswith(prefix)]
        if not matches:
            return [(BASE, self.base)]
        return [self.installation(i) for i in self.path_extras[max(matches, key=len)]]

    def installation(self, extras: str) -> tuple[str, frozenset[str]]:
        """``extras`` (``"a"`` or ``"a+b"``): its label and what it declares together."""
        names = extras.split("+")
        declared = frozenset().union(*(self.extras.get(name, frozenset()) for name in names))
        return f"[{','.join(names)}]", declared


def _closure(extra: str, declared: Mapping[str, list[str]], project: str) -> frozenset[str]:
    names: set[str] = set()
    pending, seen = [extra], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for requirement in declared[current]:
            name = _requirement_name(requirement)
            if name == project:
                included = requirement.split("[", 1)[1].split("]", 1)[0]
                pending.extend(part.strip() for part in included.split(","))
            else:
                names.add(name)
    return frozenset(names)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass(frozen=True)
class _Import:
    module: str
    line: int
    extra: str | None = None
    """The extra an ``import_optional`` call names; None for an import statement."""


def _imports(tree: ast.Module) -> Iterator[_Import]:
    """The file's absolute imports and ``import_optional`` calls, outside TYPE_CHECKING and
    outside a ``try:`` that catches ImportError."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Try) and _catches_import_error(node):
            pending.extend(s for s in node.body if not isinstance(s, ast.Import | ast.ImportFrom))
            pending.extend([*node.handlers, *node.orelse, *node.finalbody])
            continue
        if isinstance(node, ast.Import):
            yield from (_Import(alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield _Import(node.module, node.lineno)
        elif isinstance(node, ast.Call) and _called_name(node.func) == "import_optional":
            module = node.args[0] if node.args else None
            extra = next((k.value for k in node.keywords if k.arg == "extra"), None)
            if (
                isinstance(module, ast.Constant)
                and isinstance(module.value, str)
                and isinstance(extra, ast.Constant)
                and isinstance(extra.value, str)
            ):
                yield _Import(module.value, node.lineno, extra.value)
        pending.extend(ast.iter_child_nodes(node))


def _catches_import_error(node: ast.Try) -> bool:
    caught: list[ast.expr] = []
    for handler in node.handlers:
        if isinstance(handler.type, ast.Tuple):
            caught.extend(handler.type.elts)
        elif handler.type is not None:
            caught.append(handler.type)
    return any(_called_name(c) in {"ImportError", "ModuleNotFoundError"} for c in caught)


def _is_type_checking(test: ast.expr) -> bool:
    return _called_name(test) == "TYPE_CHECKING"


def _called_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


class _Distributions:
    """Which installed distributions provide a top-level module, and who requires whom."""

    def __init__(self) -> None:
        self.by_module = {
            module: {normalise(d) for d in dists}
            for module, dists in importlib.metadata.packages_distributions().items()
        }

    def of(self, module: str) -> set[str]:
        # A module nothing installed provides: its distribution is taken to share its name.
        return self.by_module.get(module, {normalise(module)})

    @staticmethod
    def required_by(distribution: str) -> list[str]:
        """The installed distributions that declare ``distribution`` as a requirement."""
        names = set()
        for dist in importlib.metadata.distributions():
            for requirement in dist.requires or ():
                # A requirement of one of its extras comes only with that extra.
                optional = re.search(r";.*\bextra\s*==", requirement)
                if not optional and _requirement_name(requirement) == distribution:
                    names.add(normalise(dist.metadata["Name"]))
        return sorted(names)


def check(root: Path) -> tuple[list[Finding], int]:
    """The findings under the project at ``root``, and how many files were read."""
    project = ProjectDependencies.read(root)
    distributions = _Distributions()
    findings: list[Finding] = []
    files = sorted(
        path for tree in project.roots for path in (root / tree).rglob("*.py") if path.is_file()
    )
    for path in files:
        relative = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(), filename=relative)
        installations = project.installations(relative)
        for found in _imports(tree):
            top = found.module.split(".")[0]
            if (
                top in sys.stdlib_module_names
                or top in project.first_party
                or (path.parent / f"{top}.py").is_file()
                or (path.parent / top).is_dir()
            ):
                continue
            provided = distributions.of(top)
            targets = (
                [project.installation(found.extra)] if found.extra is not None else installations
            )
            for label, declared in targets:
                if provided & declared:
                    continue
                message = _message(top, provided, label, distributions, project.name)
                findings.append(Finding(relative, found.line, message))
    return sorted(findings, key=lambda f: (f.path, f.line)), len(files)


def _message(
    module: str, provided: set[str], label: str, distributions: _Distributions, project: str
) -> str:
    name = " or ".join(sorted(provided))
    requirers = sorted(
        {r for dist in provided for r in distributions.required_by(dist)} - {project}
    )
    how = f"; here it comes only with {', '.join(requirers)}" if requirers else ""
    fix = "add it to [project] dependencies" if label == BASE else f"declare it in {label}"
    return f"imports {module} (distribution {name}), not declared in {label}{how}: {fix}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args(argv)
    try:
        findings, files = check(args.root)
    except (OSError, ValueError, KeyError, SyntaxError) as exc:
        print(f"dependency check: {exc}", file=sys.stderr)
        return 2
    for finding in findings:
        print(finding)
    if findings:
        print(f"dependency check: {len(findings)} undeclared imports in {files} files")
        return 1
    print(f"dependency check: every import of {files} files is declared")
    return 0


if __name__ == "__main__":
    sys.exit(main())
