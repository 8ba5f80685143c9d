"""What a child process needs to rebuild the workflow, grader and configs: JSON references.

Classes travel as (module, qualified name, file). A class defined in the server's
``__main__`` (``python main.py``, ``osmosis eval run``) is loaded in the child from its file
under another module name, so the file's ``if __name__ == "__main__":`` block does not run.
Configs travel as their class plus their JSON dump and are validated again in the child.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from osmosis_ai.errors import ConfigError

__all__ = ["LoadedSpec", "dump_spec", "load_spec", "source_paths"]

# Module name under which a server's ``__main__`` file is loaded in children.
_MAIN_ALIAS = "_osmosis_rollout_main"


@dataclass(frozen=True)
class LoadedSpec:
    """The objects a child runs, rebuilt from a spec."""

    workflow: type[Any]
    workflow_config: Any
    grader: type[Any] | None
    grader_config: Any


def _class_ref(cls: type[Any], label: str) -> dict[str, Any]:
    qualname = cls.__qualname__
    if "<locals>" in qualname:
        raise ConfigError(
            f"{label} {qualname} is defined inside a function; a child process can only load "
            "classes defined at module level"
        )
    module = cls.__module__
    file = None
    if module == "__main__":
        try:
            file = inspect.getfile(cls)
        except (TypeError, OSError):
            raise ConfigError(
                f"{label} {qualname} was defined interactively; put it in a file"
            ) from None
    return {"module": module, "qualname": qualname, "file": file}


def _config_ref(config: BaseModel | None, label: str) -> dict[str, Any] | None:
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
    return {"class": _class_ref(type(config), label), "data": data}


def dump_spec(
    workflow: type[Any],
    workflow_config: BaseModel | None,
    grader: type[Any] | None,
    grader_config: BaseModel | None,
) -> bytes:
    """The JSON spec of these objects, plus this process's import path and directory.

    Raises:
        ConfigError: An object cannot be rebuilt in another process.
    """
    spec = {
        "workflow": _class_ref(workflow, "workflow"),
        "workflow_config": _config_ref(workflow_config, "workflow_config"),
        "grader": None if grader is None else _class_ref(grader, "grader"),
        "grader_config": _config_ref(grader_config, "grader_config"),
        "sys_path": [entry for entry in sys.path if entry],
    }
    return json.dumps(spec).encode()


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


def _load_config(ref: dict[str, Any] | None) -> Any:
    if ref is None:
        return None
    return _load_class(ref["class"]).model_validate(ref["data"])


def load_spec(data: bytes) -> LoadedSpec:
    """Import what ``data`` names (extending ``sys.path`` as the server had it)."""
    spec = json.loads(data)
    for entry in spec["sys_path"]:
        if entry not in sys.path:
            sys.path.append(entry)
    return LoadedSpec(
        workflow=_load_class(spec["workflow"]),
        workflow_config=_load_config(spec["workflow_config"]),
        grader=None if spec["grader"] is None else _load_class(spec["grader"]),
        grader_config=_load_config(spec["grader_config"]),
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
