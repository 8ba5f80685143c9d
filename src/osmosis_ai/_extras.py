"""Optional dependencies: which extra owns which module, and the import that says so."""

from __future__ import annotations

import importlib
from types import ModuleType

from osmosis_ai.errors import MissingExtraError

__all__ = ["EXTRA_DISTRIBUTIONS", "import_optional"]

#: extra name -> ((distribution, top-level module), ...). Kept in step with the
#: ``[project.optional-dependencies]`` table of pyproject.toml by tests/test_extras.py.
EXTRA_DISTRIBUTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "server": (
        ("starlette", "starlette"),
        ("uvicorn", "uvicorn"),
        ("uvloop", "uvloop"),
        ("httptools", "httptools"),
        ("aiohttp", "aiohttp"),
        ("anyio", "anyio"),
    ),
    "gateway": (("xllamacpp", "xllamacpp"),),
    "litellm": (("litellm", "litellm"),),
    "strands": (("strands-agents", "strands"), ("openai", "openai")),
    "openai-agents": (("openai-agents", "agents"), ("openai", "openai")),
    "langgraph": (
        ("langgraph", "langgraph"),
        ("langchain-core", "langchain_core"),
        ("langchain-openai", "langchain_openai"),
        ("openai", "openai"),
    ),
    "pydantic-ai": (("pydantic-ai-slim", "pydantic_ai"), ("openai", "openai")),
    "eval": (("pyarrow", "pyarrow"),),
    "ray": (("ray", "ray"),),
    "harbor": (("harbor", "harbor"),),
    "viewer": (),
    "reasoning-gym": (("reasoning-gym", "reasoning_gym"),),
    "openenv": (("openenv", "openenv"),),
    "verifiers": (("verifiers", "verifiers"),),
    "train": (
        ("torch", "torch"),
        ("transformers", "transformers"),
        ("gguf", "gguf"),
        ("accelerate", "accelerate"),
        ("llguidance", "llguidance"),
        ("peft", "peft"),
    ),
    "track": (
        ("tensorboard", "tensorboard"),
        ("wandb", "wandb"),
        ("mlflow-skinny", "mlflow"),
        ("sqlalchemy", "sqlalchemy"),
        ("alembic", "alembic"),
        ("trackio", "trackio"),
    ),
    "skyrl": (("skyrl", "skyrl"),),
    "verl": (("verl", "verl"), ("omegaconf", "omegaconf"), ("torch", "torch")),
}


def _owned_modules(extra: str) -> set[str]:
    return {module for _, module in EXTRA_DISTRIBUTIONS[extra]}


def import_optional(module: str, *, extra: str, feature: str) -> ModuleType:
    """Import ``module``, turning its absence into an error that names the extra to install.

    Args:
        module: Dotted module name to import.
        extra: The ``osmosis-ai[...]`` extra that provides it.
        feature: What the caller was doing, for the message (e.g. ``"The rollout server"``).

    Returns:
        The imported module.

    Raises:
        MissingExtraError: The module, or one the extra installs, is missing. A missing module
            that the extra does not own propagates unchanged: it is a different problem.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or module).split(".")[0]
        if missing not in _owned_modules(extra) | {module.split(".")[0]}:
            raise
        raise MissingExtraError(feature, extra, missing) from exc
