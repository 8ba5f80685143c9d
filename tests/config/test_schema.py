"""Settings declared once (``osmosis_ai.config.schema``) and what is made of them: the loaders'
checks, the scaffold, the docs' tables, the resolved config; and that no setting is declared
a second time anywhere in the package."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

import osmosis_ai
from osmosis_ai.config.schema import (
    Key,
    Section,
    markdown_table,
    scaffold_toml,
    section_of,
    setting,
    settings_toml,
    subsection,
    toml_value,
    walk_keys,
)
from osmosis_ai.errors import ConfigError, SettingError
from osmosis_ai.eval.config import EVAL_EXPERIMENT, EVALUATION, load_eval_config
from osmosis_ai.scaffold import scaffold_rollout
from osmosis_ai.train.config import TRAIN_EXPERIMENT, TRAIN_SECTIONS, load_train_config

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "osmosis_ai"
#: Every section a file may hold a key of, subsections included.
SECTIONS = (
    EVAL_EXPERIMENT,
    EVALUATION,
    TRAIN_EXPERIMENT,
    *dict.fromkeys(section for top in TRAIN_SECTIONS for section, _ in walk_keys(top)),
)
PARSED = [section for section in SECTIONS if "experiment" not in section.name]


def _id(section: Section) -> str:
    return section.name


# --- declared once ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Inner:
    size: int = setting(2, comment="how big", docs="its size")


@dataclass(frozen=True)
class Outer:
    mode: Literal["a", "b"] = setting("a", comment="which", docs="the mode")
    rate: float | None = setting(None, bound="non-negative", comment="r", docs="a rate")
    inner: Inner | None = subsection(comment="off unless written", docs="the inner part")


@dataclass(frozen=True)
class Bounds:
    low: float = setting(0.0, docs="the bounds")
    high: float = setting(0.5, joins_row=True)


@dataclass(frozen=True)
class Pair:
    low: float = setting(0.0, docs="low")
    high: float = setting(1.0, docs="high")

    def __post_init__(self) -> None:
        if self.high < self.low:
            raise SettingError("high", f"high ({self.high}) must be at least low")


def _string_sets(tree: ast.AST) -> Iterator[frozenset[str]]:
    """The string constants of every tuple, list, set and ``Literal[...]`` in ``tree``."""
    literals = [
        node.slice
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "Literal"
    ]
    for node in ast.walk(tree):
        elements: list[ast.expr] = []
        if node in literals:
            continue  # counted as its Literal
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            elements = list(node.elts)
        elif isinstance(node, ast.Subscript) and node.slice in literals:
            inner = node.slice
            elements = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
        strings = [e.value for e in elements if isinstance(e, ast.Constant)]
        if len(strings) >= 2 and all(isinstance(s, str) for s in strings):
            yield frozenset(str(s) for s in strings)


def test_every_setting_s_choices_are_written_once_in_the_package() -> None:
    """The loss names, the tis modes, the engines...: the ``Literal`` a setting's field is
    typed with is their one spelling; a second tuple or Literal of them is a copy to fold."""
    found: dict[frozenset[str], list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for strings in _string_sets(ast.parse(path.read_text(encoding="utf-8"))):
            found.setdefault(strings, []).append(str(path.relative_to(SRC)))
    for section in SECTIONS:
        for key in section.keys:
            if len(key.choices) < 2:
                continue
            where = [f for strings, files in found.items() if strings == set(key.choices)
                     for f in files]  # fmt: skip
            assert len(where) == 1, f"{section.name}.{key.name}'s choices are written in {where}"


def _package_dataclasses() -> Iterator[type]:
    for module in pkgutil.walk_packages(osmosis_ai.__path__, "osmosis_ai."):
        if ".integrations." in module.name or module.name.endswith(("skyrl_main", "__main__")):
            continue  # optional frameworks: they declare no settings
        try:
            imported = importlib.import_module(module.name)
        except ImportError:  # an extra this environment lacks (the engines' venv has them)
            continue
        for value in vars(imported).values():
            if dataclasses.is_dataclass(value) and value.__module__ == module.name:
                yield value  # type: ignore[misc]


def test_no_dataclass_copies_a_section_s_settings() -> None:
    """A dataclass that repeats three or more of a section's settings, by name and default,
    besides the section itself is the copy the update once kept (`GrpoConfig`): it is to be
    replaced by the section (or a field holding it)."""
    declared = {section.cls for section in SECTIONS}
    defaults = {
        section.name: {key.attribute: key.default for key in section.keys} for section in SECTIONS
    }
    for cls in _package_dataclasses():
        if cls in declared:
            continue
        mine = {
            f.name: f.default
            for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING
        }
        for name, keys in defaults.items():
            shared = [k for k, v in keys.items() if k in mine and mine[k] == v]
            assert len(shared) < 3, f"{cls.__module__}.{cls.__qualname__} copies [{name}] {shared}"


@pytest.mark.parametrize("section", SECTIONS, ids=_id)
def test_declarations_are_complete(section: Section) -> None:
    assert not section.keys or not section.keys[0].setting.joins_row
    for key in section.keys:
        declared = key.setting
        assert bool(declared.docs) != declared.joins_row, f"{key.name}: docs, or join the row"
        assert "|" not in declared.docs, f"{key.name}: a '|' would split the docs' table row"
        if key.kind == "custom" and "experiment" not in section.name:
            assert declared.parse is not None, f"{key.name}: a custom key needs its parse"


def test_a_key_added_to_a_section_reaches_the_parser_scaffold_and_docs() -> None:
    """One field is the whole declaration: its kind from its type, its choices from its
    ``Literal``, a subsection from a dataclass type (absent: off)."""

    section = section_of(Outer, "outer")
    assert [(k.name, k.kind, k.choices) for k in section.keys] == [
        ("mode", "choice", ("a", "b")), ("rate", "number", ()),
    ]  # fmt: skip
    assert [(s.attribute, s.optional) for s in section.subsections] == [("inner", True)]
    assert scaffold_toml(section).splitlines() == [
        "[outer]",
        'mode = "a"                       # which',
        "",
        "# [outer.inner]                  # off unless written",
        "# size = 2                       # how big",
    ]
    assert markdown_table(section).splitlines()[2:] == [
        '| `[outer] mode` | `"a"` | the mode |',
        "| `rate` | – | a rate |",
        "| `[outer.inner]` | off | the inner part |",
        "| `[outer.inner] size` | 2 | its size |",
    ]
    on = Outer(mode="b", inner=Inner())
    assert settings_toml(section, on).splitlines() == [
        "[outer]", 'mode = "b"', "# rate: not set (–)", "", "[outer.inner]", "size = 2",
    ]  # fmt: skip


def test_a_table_row_can_explain_several_keys() -> None:
    assert markdown_table(section_of(Bounds, "s")).splitlines()[2:] == [
        "| `[s] low`, `high` | 0, 0.5 | the bounds |",
    ]


def test_a_path_is_written_as_its_text() -> None:
    assert toml_value(Path("/data/rows.jsonl")) == '"/data/rows.jsonl"'


@pytest.mark.parametrize(
    "value", [1e-5, 0.0, 2, 'a "quoted" \\ path', ("q_proj", "v_proj"), {"A": "1"}, {}, True]
)
def test_toml_values_read_back_as_written(value: Any) -> None:
    text = toml_value(value)
    read = tomllib.loads(f"v = {text}")["v"]
    assert read == (list(value) if isinstance(value, tuple) else value)
    assert type(read) is (list if isinstance(value, tuple) else type(value))


# --- the scaffold, the docs and the resolved config ------------------------------------------


def test_the_scaffold_writes_every_declared_key_with_its_comment(tmp_path: Path) -> None:
    scaffold_rollout(tmp_path, "r")
    for config, sections in (
        ("configs/eval/r.toml", (EVAL_EXPERIMENT, EVALUATION)),
        ("configs/training/r.toml", (TRAIN_EXPERIMENT, *SECTIONS[3:])),
    ):
        text = (tmp_path / config).read_text()
        for section in sections:
            if f"[{section.name}]" not in text:
                assert section.name == "engine.vllm", "only vLLM's table is not scaffolded"
                continue
            body = text.split(f"[{section.name}]", 1)[1].split("\n", 1)[1]
            lines = [x for x in body.split("\n\n", 1)[0].splitlines() if x.strip()]
            written = [x.removeprefix("# ").split(" = ")[0] for x in lines]
            assert written == [key.name for key in section.keys], section.name
            for key, line in zip(section.keys, lines, strict=True):
                assert line.endswith(f"  # {key.setting.comment}") and key.setting.comment, line
                assert line.index(" # ") >= 31, "the comments share a column"
    # What the scaffold writes loads, and trains with every default it does not write.
    assert load_train_config(tmp_path / "configs" / "training" / "r.toml").training.steps == 4


def test_the_docs_tables_are_the_declared_ones() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "config_tables.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr  # run python scripts/config_tables.py


# --- the checks each declaration asks for, through the loaders (and --set) -------------------

#: Flags a section's keys need beside them: a subsection's required keys.
_BESIDE = {
    "learner.lora": ("learner.lora.rank=4",),
    "algorithm.distill": ('algorithm.distill.teacher="rollouts/r"',),
}


def _load(tmp_path: Path, section: Section, setting_text: str, *beside: str) -> object:
    """Load the scaffold's config of ``section`` with ``section.setting`` set by ``--set``,
    and the ``beside`` flags (settings it needs) before it."""
    if not (tmp_path / "rollouts" / "r").is_dir():
        scaffold_rollout(tmp_path, "r")
    override = f"{section.name}.{setting_text}"
    if section is EVALUATION:
        return load_eval_config(tmp_path / "configs" / "eval" / "r.toml", [override])
    flags = [*_BESIDE.get(section.name, ()), *beside, override]
    return load_train_config(tmp_path / "configs" / "training" / "r.toml", flags)


def _error(tmp_path: Path, section: Section, setting_text: str) -> str:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, section, setting_text)
    message = str(info.value)
    assert f", --set {section.name}.{setting_text}: " in message, "the flag is named"
    return message.split(": ", 1)[1]


def _keys(*kinds: str) -> list[Any]:
    return [
        pytest.param(section, key, id=f"{section.name}.{key.name}")
        for section in PARSED
        for key in section.keys
        if key.kind in kinds
    ]


#: Values a key of each kind refuses whatever its bound, and how the error says it.
_REFUSED = {
    "integer": [("1.5", "an integer, got a float"), ("true", "an integer, got a boolean")],
    "number": [
        ('"1"', "a number, got a string"),
        ("[1]", "a number, got an array"),
        ("nan", "finite, got nan"),
        ("inf", "finite, got inf"),
    ],
}

#: Keys whose section's own rules (`SettingError`) check beyond their kind and bound: a value
#: they take, and the flags they need beside them (the rules are tested in tests/train).
_RULED: dict[str, tuple[str, tuple[str, ...]]] = {
    "training.group_size": ("2", ()),
    "learner.token_budget": ("2", ()),
    "algorithm.dual_clip": ("3.5", ()),
    "algorithm.tis_cap": ("1.5", ()),
    "algorithm.tis_floor": ("0.5", ("algorithm.tis_cap=2", 'algorithm.tis_mode="token_mask"')),
    "algorithm.tis_mode": ("", ("algorithm.tis_cap=2",)),
}


@pytest.mark.parametrize(("section", "key"), _keys("integer", "number"))
def test_a_numeric_key_takes_the_values_its_kind_and_bound_allow(
    tmp_path: Path, section: Section, key: Key
) -> None:
    name = f"{section.name}.{key.name}"
    for value, expected in _REFUSED[key.kind]:
        assert _error(tmp_path, section, f"{key.name}={value}") == f"{name} must be {expected}"
    taken, beside = _RULED.get(name, ("1" if key.kind == "integer" else "0.5", ()))
    assert _load(tmp_path, section, f"{key.name}={taken}", *beside)
    bound = key.setting.bound
    if bound == "any":
        assert _load(tmp_path, section, f"{key.name}=-1")
    elif bound == "non-negative":
        assert _load(tmp_path, section, f"{key.name}=0", *beside)
        assert _error(tmp_path, section, f"{key.name}=-1") == f"{name} must not be negative, got -1"
    else:
        assert _error(tmp_path, section, f"{key.name}=0") == f"{name} must be positive, got 0"


@pytest.mark.parametrize(("section", "key"), _keys("choice"))
def test_a_choice_key_names_its_choices(tmp_path: Path, section: Section, key: Key) -> None:
    message = _error(tmp_path, section, f"{key.name}=bogus")
    choices = ", ".join(key.choices)
    assert message == f"{section.name}.{key.name} must be one of {choices}, got 'bogus'"
    beside = _RULED.get(f"{section.name}.{key.name}", ("", ()))[1]
    for choice in key.choices:
        assert _load(tmp_path, section, f"{key.name}={choice}", *beside)


@pytest.mark.parametrize("section", PARSED, ids=_id)
def test_an_undeclared_key_is_refused_naming_the_declared_ones(
    tmp_path: Path, section: Section
) -> None:
    message = _error(tmp_path, section, "bogus=1")
    assert message == (
        f"unknown key '{section.name}.bogus'; [{section.name}] accepts " + ", ".join(section.names)
    )


@pytest.mark.parametrize(
    ("section", "written", "meant"),
    [
        ("learner", "lr", "learning_rate"),  # the initials of its words
        ("learner", "learning_rte", "learning_rate"),  # a near spelling
        ("training", "num_generations", "group_size"),  # TRL's name
        ("algorithm", "kl_coef", "kl_beta"),  # verl's
    ],
)
def test_a_near_miss_key_is_answered_with_the_key_meant(
    tmp_path: Path, section: str, written: str, meant: str
) -> None:
    (declared,) = [s for s in PARSED if s.name == section]
    message = _error(tmp_path, declared, f"{written}=1")
    assert message.startswith(
        f"unknown key '{section}.{written}'; did you mean '{section}.{meant}'? [{section}] accepts "
    )


def test_a_near_miss_section_is_answered_with_the_section_meant(tmp_path: Path) -> None:
    scaffold_rollout(tmp_path, "r")
    with pytest.raises(ConfigError) as info:
        load_train_config(tmp_path / "configs" / "training" / "r.toml", ["traning.steps=3"])
    assert "unknown section [traning]; did you mean [training]? " in str(info.value)


def test_a_group_of_one_is_refused_it_can_never_have_a_gradient(tmp_path: Path) -> None:
    (training,) = [s for s in PARSED if s.name == "training"]
    message = _error(tmp_path, training, "group_size=1")
    assert message.startswith("training.group_size must be at least 2, got 1: ")


def test_a_section_s_rule_is_placed_at_the_line_of_the_key_it_names(tmp_path: Path) -> None:
    from osmosis_ai.config.lines import key_lines
    from osmosis_ai.config.schema import parse_section
    from osmosis_ai.config.source import ConfigSource

    text = "[pair]\nlow = 2\nhigh = 1\n"
    src = ConfigSource(tmp_path / "p.toml", key_lines(text))
    with pytest.raises(ConfigError) as info:
        parse_section(src, tomllib.loads(text)["pair"], section_of(Pair, "pair"))
    assert str(info.value) == f"{tmp_path / 'p.toml'}, line 3: pair.high (1.0) must be at least low"
