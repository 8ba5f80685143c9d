"""The one error tree of osmosis_ai.

```
OsmosisError
├── ConfigError                 misuse: bad arguments, config, import paths (also ValueError)
│   ├── InvalidIdError          an id that would escape its path segment
│   ├── SettingError            one setting of a config object cannot take its value (setting)
│   └── DatasetRowError         a dataset row that cannot become a rollout input
├── MissingExtraError           an optional dependency is absent (also ModuleNotFoundError)
├── RolloutProtocolError        a rollout server answered outside the protocol (status_code)
│   └── RolloutAdmissionTimeoutError  admission did not succeed in time (also TimeoutError)
├── GatewayError                the model gateway answers an OpenAI-style error (status_code)
│   ├── ChatRequestError        the caller's chat request is invalid                -> 4xx
│   └── PolicyError             the policy (model backend) failed; 4xx kept, else 502/504
└── RolloutFailure              a rollout ended without a usable result     -> agent_error
    ├── DeadlineExceeded        the workflow or grader missed its deadline  -> timeout
    ├── OutputShapeError        run() returned something that is no sample  -> validation_error
    ├── GradingError            the grader could not run or set no reward   -> validation_error
    └── JudgeError              a model judge failed or gave no valid score -> judge_error
```

Every class declares the wire category it maps to (``category``), so turning an exception
into an ``err_category`` is a lookup, never a guess from built-in types. Messages name the
cause and the fix and never contain a secret.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "ChatRequestError",
    "ConfigError",
    "CredentialScrubError",
    "DatasetRowError",
    "DeadlineExceeded",
    "GatewayError",
    "GradingError",
    "InvalidIdError",
    "JudgeError",
    "MissingExtraError",
    "OsmosisError",
    "OutputShapeError",
    "PolicyError",
    "RolloutAdmissionTimeoutError",
    "RolloutFailure",
    "RolloutProtocolError",
    "SettingError",
]


class OsmosisError(Exception):
    """Base class of every error raised by osmosis_ai."""

    #: Wire error category (a ``RolloutErrorCategory`` value) when this error ends a rollout.
    category: ClassVar[str] = "internal_error"


class ConfigError(OsmosisError, ValueError):
    """The caller passed an invalid argument, config value or import path."""

    category = "validation_error"


class InvalidIdError(ConfigError):
    """An id that touches a filesystem path or URL is not a single safe path segment."""

    def __init__(self, label: str, value: object) -> None:
        self.label = label
        super().__init__(
            f"{label} {value!r} must be a single path segment: non-empty, not '.' or '..', "
            "and without '/', '\\' or NUL characters"
        )


class SettingError(ConfigError):
    """One setting of a config object cannot take its value (alone or beside another).

    ``setting`` names it, so a loader can point at the line of the file that set it.
    """

    def __init__(self, setting: str, message: str) -> None:
        self.setting = setting
        super().__init__(message)


class DatasetRowError(ConfigError):
    """A dataset row cannot be turned into a prompt, label and metadata."""

    def __init__(self, message: str, *, row: int | None = None, column: str | None = None) -> None:
        self.row = row
        self.column = column
        where = []
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column {column!r}")
        prefix = f"dataset {', '.join(where)}: " if where else "dataset row: "
        super().__init__(prefix + message)


class MissingExtraError(OsmosisError, ModuleNotFoundError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, feature: str, extra: str, missing: str, *, install: str = "") -> None:
        self.extra = extra
        command = install or f"pip install 'osmosis-ai[{extra}]'"
        super().__init__(
            f"{feature} requires optional dependencies (missing {missing!r}). "
            f"Install them with: {command}",
            name=missing,
        )


class RolloutProtocolError(OsmosisError):
    """A rollout server answered something the protocol does not allow, or not at all.

    Attributes:
        status_code: HTTP status of the answer, or ``None`` for a transport failure.
        rollout_id: The rollout concerned, when there is one.
    """

    category = "http_error"

    def __init__(
        self, message: str, *, status_code: int | None = None, rollout_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.rollout_id = rollout_id


class RolloutAdmissionTimeoutError(RolloutProtocolError, TimeoutError):
    """``POST /rollout`` did not succeed within the admission timeout.

    A request may still have been admitted if an answer was in flight; the server's lease
    expiry then cleans it up.
    """

    category = "timeout"


class GatewayError(OsmosisError):
    """An error the model gateway answers with, in OpenAI's error shape.

    Attributes:
        status_code: HTTP status of the answer.
        error_type: OpenAI ``error.type`` (``invalid_request_error``, ``upstream_error``...).
        param: The request field at fault, when there is one.
    """

    category = "http_error"

    def __init__(
        self, message: str, *, status_code: int, error_type: str, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.error_type = error_type
        self.param = param


class ChatRequestError(GatewayError):
    """The caller's chat-completions request cannot be served as sent."""

    def __init__(self, message: str, *, status_code: int = 400, param: str | None = None) -> None:
        super().__init__(
            message, status_code=status_code, error_type="invalid_request_error", param=param
        )


class PolicyError(GatewayError):
    """The policy behind the gateway failed: an upstream error, timeout or engine failure."""

    def __init__(
        self, message: str, *, status_code: int = 502, error_type: str = "upstream_error"
    ) -> None:
        super().__init__(message, status_code=status_code, error_type=error_type)


class RolloutFailure(OsmosisError):
    """A rollout phase ended without a usable result."""

    category = "agent_error"


class DeadlineExceeded(RolloutFailure, TimeoutError):
    """The workflow or grader ran past its deadline."""

    category = "timeout"


class OutputShapeError(RolloutFailure, TypeError):
    """``run()`` returned a value that is not one of the accepted sample shapes."""

    category = "validation_error"


class GradingError(RolloutFailure):
    """The grader could not run, or finished without rewarding a kept sample."""

    category = "validation_error"


class JudgeError(RolloutFailure):
    """A model judge failed, timed out, or answered no score in its declared range."""

    category = "judge_error"


class CredentialScrubError(OsmosisError):
    """A rollout's files could not be proven free of its key, nor deleted; nothing was kept."""
