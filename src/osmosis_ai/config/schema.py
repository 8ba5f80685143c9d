"""Config settings declared once, as fields of the dataclasses the code uses.

A section of a config file is a frozen dataclass; each of its settings is a field made by
`setting`, which carries what the field's name, type and default do not: its bound, the
comment ``osmosis rollout init`` writes beside it, its docs text, the key it replaced. A field
whose type is another such dataclass is a subsection (``[learner.lora]``); typed ``X | None``
it is optional, and absent means off. Everything else derives from the declaration:

- `parse_section` checks a TOML table against it (unknown keys with a "did you mean", types,
  bounds, choices from a ``Literal``) and builds the dataclass, placing any error at the
  file's line, including a `SettingError` the dataclass raises for two values that do not go
  together;
- `scaffold_toml` writes the section as the scaffold does, `markdown_table` the docs' table,
  `settings_toml` a built section back as TOML (the run's resolved config).

Adding a setting is one field; its use is the only other edit.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field
from pathlib import PurePath
from typing import Any, Literal, TypeVar

from osmosis_ai.config.source import Bound, ConfigSource, TOMLTable, kind_of
from osmosis_ai.errors import SettingError

__all__ = [
    "Key",
    "Kind",
    "Parser",
    "Section",
    "Setting",
    "Subsection",
    "check_keys",
    "declared",
    "markdown_table",
    "parse_section",
    "scaffold_toml",
    "section_of",
    "setting",
    "settings_toml",
    "subsection",
    "toml_value",
    "walk_keys",
]

#: How a key's value is checked: from its type, or by the `Setting.parse` it declares.
Kind = Literal["boolean", "integer", "number", "string", "choice", "custom"]

#: The check of a ``custom`` key: ``(src, table, section name)`` to its validated value.
Parser = Callable[[ConfigSource, TOMLTable, str], object]

_T = TypeVar("_T")
_METADATA = "osmosis_ai.setting"

#: The scaffold's comments start in this column (or two spaces after a longer setting).
_COMMENT_COLUMN = 33


@dataclass(frozen=True)
class Setting:
    """What a config field declares beyond its name, type and default."""

    comment: str = ""
    """What the scaffold writes after the key."""
    docs: str = ""
    """The "Meaning" of the docs' table (markdown); empty when the key `joins_row`."""
    bound: Bound = "positive"
    """For integers and numbers: which values are accepted."""
    required: bool = False
    """The file must set it (unless a recipe already did)."""
    scaffold: object = None
    """The value the scaffold writes, when it is not the default."""
    commented: bool = False
    """The scaffold writes the key commented out (an option to uncomment)."""
    docs_default: str = ""
    """The docs' "Default" when it is not the default written as TOML."""
    joins_row: bool = False
    """The docs' table lists the key in the row of the key before it, which explains both."""
    key: str = ""
    """The key in the file, when it is not the field's name."""
    aliases: tuple[str, ...] = ()
    """Other trainers' names for it (TRL's, verl's): a config using one is told this key."""
    parse: Parser | None = None
    """The check of a key whose type is not a plain TOML value (or whose value is)."""
    formerly: str = ""
    """The ``section.key`` it had in the flat config of before, for the migration line."""


def setting(
    default: Any = MISSING, *, factory: Callable[[], Any] | None = None, **declared: Any
) -> Any:
    """A config field: its default (or ``factory``) and its `Setting` (keyword arguments)."""
    metadata = {_METADATA: Setting(**declared)}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def declared(declaration: Setting, default: Any = MISSING) -> Any:
    """A config field with a `Setting` that several sections share (``[experiment]
    rollout``): one declaration, a field of each dataclass."""
    return field(default=default, metadata={_METADATA: declaration})


def subsection(
    factory: Callable[[], Any] | None = None, *, comment: str = "", docs: str = ""
) -> Any:
    """A field holding a subsection's dataclass: built from ``factory`` when the file has no
    table for it, or ``None`` (off) when the field is optional and has no factory."""
    default = None if factory is None else MISSING
    return setting(default, factory=factory, comment=comment, docs=docs)


@dataclass(frozen=True, eq=False)  # one per declaration (`section_of` caches)
class Key:
    """One key of a section, derived from its field."""

    name: str
    attribute: str
    kind: Kind
    default: object
    """The field's default (a factory's value); ``None`` for "not set"."""
    choices: tuple[str, ...]
    setting: Setting


@dataclass(frozen=True, eq=False)  # one per declaration (`section_of` caches)
class Subsection:
    """A field whose value is a section of its own (``[learner.lora]``)."""

    attribute: str
    section: Section
    optional: bool
    """``X | None``: absent means ``None`` (off)."""
    setting: Setting


@dataclass(frozen=True, eq=False)  # one per declaration (`section_of` caches)
class Section:
    """A ``[name]`` table: its keys in declaration order, and its subsections."""

    name: str
    cls: type
    keys: tuple[Key, ...]
    subsections: tuple[Subsection, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """The keys and subsections a table may hold."""
        return tuple(key.name for key in self.keys) + tuple(s.attribute for s in self.subsections)

    @property
    def aliases(self) -> dict[str, str]:
        """Each key's `Setting.aliases`, to the key's name."""
        return {alias: key.name for key in self.keys for alias in key.setting.aliases}


@functools.cache
def section_of(cls: type, name: str) -> Section:
    """The section ``[name]`` that the dataclass ``cls`` declares (fields made by `setting`
    or `subsection`; others are not keys)."""
    hints = typing.get_type_hints(cls)
    keys: list[Key] = []
    subsections: list[Subsection] = []
    for item in dataclasses.fields(cls):
        declared = item.metadata.get(_METADATA)
        if declared is None:
            continue
        hint, optional = _unwrap_optional(hints[item.name])
        if dataclasses.is_dataclass(hint):
            inner = f"{name}.{item.name}" if name else item.name
            section = section_of(typing.cast(type, hint), inner)
            subsections.append(Subsection(item.name, section, optional, declared))
            continue
        kind, choices = _kind(hint, declared)
        default = item.default_factory() if item.default_factory is not MISSING else item.default
        keys.append(
            Key(
                declared.key or item.name,
                item.name,
                kind,
                None if default is MISSING else default,
                choices,
                declared,
            )
        )
    return Section(name, cls, tuple(keys), tuple(subsections))


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        kept = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(kept) < len(typing.get_args(hint)):
            return (kept[0] if len(kept) == 1 else hint), True  # several: a custom key
    return hint, False


def _kind(hint: Any, declared: Setting) -> tuple[Kind, tuple[str, ...]]:
    if declared.parse is not None:
        return "custom", ()
    if typing.get_origin(hint) is Literal:
        return "choice", tuple(typing.get_args(hint))
    kinds: dict[Any, Kind] = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if hint in kinds:
        return kinds[hint], ()
    return "custom", ()  # its loader's to check (a path against the workspace)


def walk_keys(section: Section) -> Iterator[tuple[Section, Key]]:
    """Every key of ``section`` and of its subsections, depth first."""
    for key in section.keys:
        yield section, key
    for sub in section.subsections:
        yield from walk_keys(sub.section)


# --- parsing --------------------------------------------------------------------------------------


def check_keys(
    src: ConfigSource, table: TOMLTable, section: Section, *, base: bool = False
) -> None:
    """Refuse a key ``section`` does not declare, and a missing required one (``base``: a
    recipe set them already)."""
    src.reject_unknown(table, section.name, section.names, section.aliases)
    for key in section.keys:
        if key.setting.required and not base and key.name not in table:
            raise src.error(
                (section.name,), f"{section.name}.{key.name} is required in [{section.name}]"
            )


def parse_section(
    src: ConfigSource, table: TOMLTable, section: Section, base: _T | None = None
) -> _T:
    """``section``'s dataclass with the checked value of every key ``table`` sets, over
    ``base`` (a recipe's, else the defaults); a subsection's table is parsed the same way.

    Keys are checked in the file's order, so the first error is the topmost.

    Raises:
        ConfigError: An unknown or missing key, a value of the wrong type or range, or two
            values the dataclass refuses together (at the line of the one it names).
    """
    check_keys(src, table, section, base=base is not None)
    keys = {key.name: key for key in section.keys}
    subsections = {sub.attribute: sub for sub in section.subsections}
    values: dict[str, object] = {}
    for name, value in table.items():
        if name in subsections:
            sub = subsections[name]
            if not isinstance(value, dict):
                table_name = sub.section.name
                message = f"{table_name} must be a table ([{table_name}]), got {kind_of(value)}"
                raise src.error((table_name,), message)
            inner = getattr(base, name) if base is not None else None
            values[name] = parse_section(src, value, sub.section, inner)
        else:
            values[keys[name].attribute] = _value(src, table, section.name, keys[name])
    try:
        if base is not None:
            return dataclasses.replace(base, **values)  # type: ignore[type-var]
        return typing.cast(_T, section.cls(**values))
    except SettingError as exc:
        raise _placed(src, section, exc) from None


def _placed(src: ConfigSource, section: Section, exc: SettingError) -> Exception:
    """``exc`` at the line of the key it names (a dotted name reaches into a subsection)."""
    text = str(exc)
    prefix = f"{section.name}." if text.startswith(exc.setting) else f"[{section.name}] "
    return src.error((section.name, *exc.setting.split(".")), prefix + text)


def _value(src: ConfigSource, table: TOMLTable, section: str, key: Key) -> object:
    match key.kind:
        case "boolean":
            return src.boolean(table, section, key.name)
        case "integer":
            return src.integer(table, section, key.name, key.setting.bound)
        case "number":
            return src.number(table, section, key.name, key.setting.bound)
        case "choice":
            return src.choice(table, section, key.name, key.choices)
        case "string":
            return src.string(table, section, key.name)
        case "custom":
            if key.setting.parse is None:
                raise TypeError(f"{section}.{key.name}: declared without a parse function")
            return key.setting.parse(src, table, section)


# --- writing --------------------------------------------------------------------------------------


def toml_value(value: object) -> str:
    """``value`` written as TOML (``1e-5``, ``"token"``, ``["q_proj"]``; a path as its text)."""
    if isinstance(value, PurePath):
        value = str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, float):
        mantissa, _, exponent = repr(value).partition("e")
        return f"{mantissa}e{int(exponent)}" if exponent else mantissa
    if isinstance(value, int):
        return str(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        pairs = ", ".join(f"{name} = {toml_value(item)}" for name, item in value.items())
        return f"{{ {pairs} }}" if pairs else "{}"
    raise TypeError(f"no TOML for {value!r}")


def _commented_line(setting_text: str, comment: str) -> str:
    return f"{setting_text.ljust(max(len(setting_text) + 2, _COMMENT_COLUMN))}# {comment}"


def scaffold_toml(
    section: Section, values: Mapping[str, object] | None = None, *, commented: bool = False
) -> str:
    """The ``[section]`` table the scaffold writes: every key with its comment, set to
    ``values[name]``, else to its scaffold value, else to its default; then each subsection
    that has a comment, commented out (absent: off). ``commented`` writes it all as comments."""
    mark = "# " if commented else ""
    lines = [f"{mark}[{section.name}]"]
    for key in section.keys:
        written = key.default if key.setting.scaffold is None else key.setting.scaffold
        value = (values or {}).get(key.name, written)
        if value is None:
            continue
        mark = "# " if commented or key.setting.commented else ""
        line = f"{mark}{key.name} = {toml_value(value)}"
        lines.append(_commented_line(line, key.setting.comment))
    text = "\n".join(lines) + "\n"
    for sub in section.subsections:
        if sub.setting.comment:
            header = _commented_line(f"# [{sub.section.name}]", sub.setting.comment)
            text += (
                "\n" + header + "\n" + scaffold_toml(sub.section, commented=True).split("\n", 1)[1]
            )
    return text


def settings_toml(section: Section, value: object, *, skip: tuple[str, ...] = ()) -> str:
    """The built section ``value`` written back as TOML: every key it holds (but those named
    in ``skip``), a key not set (``None``) as a comment, and its subsections that are on."""
    lines = [f"[{section.name}]"]
    for key in section.keys:
        if key.name in skip:
            continue
        item = getattr(value, key.attribute)
        if item is not None:
            lines.append(f"{key.name} = {toml_value(item)}")
        else:  # the default's rule decides, as the docs say it
            lines.append(f"# {key.name}: not set ({_docs_default(key).replace('`', '')})")
    text = "\n".join(lines) + "\n"
    for sub in section.subsections:
        inner = getattr(value, sub.attribute)
        if inner is not None:
            text += "\n" + settings_toml(sub.section, inner)
    return text


def markdown_table(*sections: Section) -> str:
    """The docs' key table of ``sections`` and their subsections: a row per key (or per
    keys that share one), a subsection's row saying what its table turns on."""
    lines = ["| Section / key | Default | Meaning |", "|---|---|---|"]
    for section in sections:
        lines.extend(_table_rows(section))
    return "\n".join(lines) + "\n"


def _table_rows(section: Section) -> Iterator[str]:
    rows: list[list[Key]] = []
    for key in section.keys:
        if key.setting.joins_row:
            rows[-1].append(key)
        else:
            rows.append([key])
    for index, row in enumerate(rows):
        names = [f"`{key.name}`" for key in row]
        if index == 0:
            names[0] = f"`[{section.name}] {row[0].name}`"
        defaults = ", ".join(_docs_default(key) for key in row)
        yield f"| {', '.join(names)} | {defaults} | {row[0].setting.docs} |"
    for sub in section.subsections:
        if sub.setting.docs:
            default = "off" if sub.optional else "–"
            yield f"| `[{sub.section.name}]` | {default} | {sub.setting.docs} |"
        yield from _table_rows(sub.section)


def _docs_default(key: Key) -> str:
    if key.setting.docs_default:
        return key.setting.docs_default
    if key.setting.required:
        return "required"
    if key.default is None or key.default == "":
        return "–"
    if key.default == 0 and isinstance(key.default, float):
        return "0"  # reads as "off", as the docs say it
    text = toml_value(key.default)
    return text if isinstance(key.default, int | float) else f"`{text}`"
