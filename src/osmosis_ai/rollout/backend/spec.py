"""What another process needs to rebuild the workflow, grader and configs: JSON references.

Classes travel as (module, qualified name, file). A class defined in the server's
``__main__`` (``python main.py``, ``osmosis eval run``) is loaded in the child from its file
under another module name, so the file's ``if __name__ == "__main__":`` block does not run.
Configs travel as their class plus their JSON dump and are validated again in the child.

A spec is either for a child on this machine (absolute files, this process's import path)
or for a bundle (files relative to the project root, which becomes the import path).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout.spec import RolloutSpec

__all__ = ["dump_spec", "load_spec", "project_root", "source_paths"]

# Module name under which a server's ``__main__`` file is loaded in children.
_MAIN_ALIAS = "_osmosis_rollout_main"


def _class_ref(cls: type[Any], label: str, root: Path | None) -> dict[str, Any]:
    qualname = cls.__qualname__
    if "<locals>" in qualname:
        raise ConfigError(
            f"{label} {qualname} is defined inside a function; a child process can only load "
            "classes defined at module level"
        )
    module = cls.__module__
    file = None
    if module == "__main__":
        file = str(_source_file(cls, label))
        if root is not None:
            file = _inside(Path(file), root, label)
    elif root is not None and not module.startswith("osmosis_ai."):
        # A bundle must contain the user's module (the image brings osmosis-ai itself).
        _inside(_source_file(cls, label), root, label)
    return {"module": module, "qualname": qualname, "file": file}


def _source_file(cls: type[Any], label: str) -> Path:
    try:
        return Path(inspect.getfile(cls)).resolve()
    except (TypeError, OSError):
        raise ConfigError(
            f"{label} {cls.__qualname__} was defined interactively; put it in a file"
        ) from None


def _inside(path: Path, root: Path, label: str) -> str:
    try:
        return path.relative_to(root.resolve()).as_posix()
    except ValueError:
        raise ConfigError(
            f"{label} is defined in {path}, outside the project {root}; pass the project "
            "directory that contains it"
        ) from None


def project_root(cls: type[Any]) -> Path:
    """The directory ``cls`` is imported from: its file's directory for ``__main__``,
    else the directory above its top-level package."""
    file = _source_file(cls, cls.__qualname__)
    if cls.__module__ == "__main__":
        return file.parent
    depth = cls.__module__.count(".") + (1 if file.name == "__init__.py" else 0)
    return file.parents[depth]


def _config_ref(config: BaseModel | None, label: str, root: Path | None) -> dict[str, Any] | None:
    if config is None:
        return None
    data = config.model_dump(mode="json")
    try:
        type(config).model_validate(json.loads(json.dumps(data)))
    except Exception as exc:
        raise ConfigError(
            f"{label} does not survive a JSON round trip ({type(exc).__name__}); a child "
            "process receives the config as JSON, so keep its fields JSON-serialisable"
        ) from None
    return {"class": _class_ref(type(config), label, root), "data": data}


def dump_spec(spec: RolloutSpec, *, root: Path | None = None) -> bytes:
    """The JSON form of ``spec``.

    Without ``root``, for a child on this machine: absolute files and this process's import
    path. With ``root``, for a bundle of that project: files relative to it.

    Raises:
        ConfigError: An object cannot be rebuilt in another process.
    """
    data = {
        "workflow": _optional_class_ref(spec.workflow, "workflow", root),
        "workflow_config": _config_ref(spec.workflow_config, "workflow_config", root),
        "grader": _optional_class_ref(spec.grader, "grader", root),
        "grader_config": _config_ref(spec.grader_config, "grader_config", root),
        "sys_path": [] if root is not None else [entry for entry in sys.path if entry],
    }
    return json.dumps(data).encode()


def _optional_class_ref(cls: type[Any] | None, label: str, root: Path | None) -> Any:
    return None if cls is None else _class_ref(cls, label, root)


def _load_main(file: str) -> Any:
    module = sys.modules.get(_MAIN_ALIAS)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(_MAIN_ALIAS, file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot load {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MAIN_ALIAS] = module
    sys.path.insert(0, str(Path(file).parent))
    spec.loader.exec_module(module)
    return module


def _load_class(ref: dict[str, Any]) -> type[Any]:
    if ref["file"] is not None:
        module = _load_main(ref["file"])
    else:
        module = importlib.import_module(ref["module"])
    obj: Any = module
    for part in ref["qualname"].split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


def load_spec(data: bytes, *, root: Path | None = None) -> RolloutSpec:
    """Import what ``data`` names: from ``root`` (a bundle's project), or with the import
    path the server had.

    Raises:
        ConfigError: A loaded object is not of the kind its slot needs.
    """
    spec = json.loads(data)
    if root is not None:
        sys.path.insert(0, str(root))
    for entry in spec["sys_path"]:
        if entry not in sys.path:
            sys.path.append(entry)

    def load(ref: dict[str, Any] | None) -> type[Any] | None:
        if ref is None:
            return None
        if root is not None and ref["file"] is not None:
            ref = {**ref, "file": str(root / ref["file"])}
        return _load_class(ref)

    def config(ref: dict[str, Any] | None) -> Any:
        cls = None if ref is None else load(ref["class"])
        return None if cls is None or ref is None else cls.model_validate(ref["data"])

    # Through resolve(): what another process loaded is checked like what a user passed.
    return RolloutSpec.resolve(
        workflow=load(spec["workflow"]),
        workflow_config=config(spec["workflow_config"]),
        grader=load(spec["grader"]),
        grader_config=config(spec["grader_config"]),
    )


def source_paths(data: bytes) -> list[Path]:
    """Directories the child imports from: the import path and the ``__main__`` files'."""
    spec = json.loads(data)
    paths = [Path(entry) for entry in spec["sys_path"]]
    for key in ("workflow", "grader"):
        if spec[key] is not None and spec[key]["file"] is not None:
            paths.append(Path(spec[key]["file"]).parent)
    for key in ("workflow_config", "grader_config"):
        if spec[key] is not None and spec[key]["class"]["file"] is not None:
            paths.append(Path(spec[key]["class"]["file"]).parent)
    return paths
