"""Resolving ``"module.path:attr"`` references to workflow, grader and config objects."""

from __future__ import annotations

import importlib

from osmosis_ai.errors import ConfigError

__all__ = ["resolve_object"]


def resolve_object(ref: object, *, label: str) -> object:
    """Return ``ref`` itself, or the object a ``"module.path:attr"`` string names.

    ``attr`` may be dotted (``"pkg.mod:Outer.Inner"``). Errors raised while importing the
    module are the user's import-time errors and propagate unchanged.

    Raises:
        ConfigError: The string is not ``module:attr`` or the attribute does not exist.
    """
    if not isinstance(ref, str):
        return ref
    module_name, sep, attr_path = ref.partition(":")
    if not sep or not module_name or not attr_path:
        raise ConfigError(
            f"{label} import path {ref!r} is invalid; expected 'module.path:attribute'"
        )
    obj: object = importlib.import_module(module_name)
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(
                f"{label} import path {ref!r}: module {module_name!r} has no attribute "
                f"{attr_path!r}"
            ) from None
    return obj
