"""The config keys' declarations (osmosis_ai.eval._config_schema) and what is made of them:
the loaders' checks, the scaffold and the docs' tables."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.eval._config_schema import (
    EVAL_EXPERIMENT,
    EVALUATION,
    TRAIN_EXPERIMENT,
    TRAINING,
    VLLM,
    Key,
    Section,
    markdown_table,
    toml_value,
)
from osmosis_ai.eval.config import EvaluationConfig, ExperimentConfig, load_eval_config
from osmosis_ai.eval.scaffold import scaffold_rollout
from osmosis_ai.train.config import TrainingConfig, VllmConfig, load_train_config
from tests.eval.conftest import ROOT

SECTIONS = (EVAL_EXPERIMENT, EVALUATION, TRAIN_EXPERIMENT, TRAINING, VLLM)


@pytest.mark.parametrize(
    ("section", "config"),
    [
        (EVAL_EXPERIMENT, ExperimentConfig),
        (EVALUATION, EvaluationConfig),
        (TRAINING, TrainingConfig),
        (VLLM, VllmConfig),
    ],
)
def test_declared_defaults_are_the_dataclass_defaults(section: Section, config: type) -> None:
    by_field = {field.name: field for field in fields(config)}
    assert sorted(key.attribute for key in section.keys) == sorted(by_field)
    for key in section.keys:
        field = by_field[key.attribute]
        if key.required:
            assert field.default is MISSING and field.default_factory is MISSING, key.name
            continue
        default = field.default if field.default_factory is MISSING else field.default_factory()
        # The type too: the docs write 0.0 and 0 apart.
        assert (type(key.default), key.default) == (type(default), default), key.name


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.name)
def test_declarations_are_complete(section: Section) -> None:
    assert not section.keys[0].joins_row
    for key in section.keys:
        assert bool(key.docs) != key.joins_row, f"{key.name}: docs text, or join the row before"
        assert bool(key.choices) == (key.kind == "choice"), key.name
        assert "|" not in key.docs, f"{key.name}: a '|' would split the docs' table row"


@pytest.mark.parametrize(
    ("config", "sections"),
    [
        ("configs/eval/r.toml", (EVAL_EXPERIMENT, EVALUATION)),
        ("configs/training/r.toml", (TRAIN_EXPERIMENT, TRAINING)),
    ],
)
def test_the_scaffold_writes_every_declared_key_with_its_comment(
    tmp_path: Path, config: str, sections: tuple[Section, ...]
) -> None:
    scaffold_rollout(tmp_path, "r")
    text = (tmp_path / config).read_text()
    for section in sections:
        lines = text.split(f"[{section.name}]\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert [line.removeprefix("# ").split(" = ")[0] for line in lines] == list(section.names)
        for key, line in zip(section.keys, lines, strict=True):
            assert line.startswith("# ") == key.commented, line
            assert line.endswith(f"  # {key.comment}") and key.comment, line
            assert line.index(" # ") >= 31, "the comments share a column"


def test_the_docs_tables_are_the_declared_ones() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "config_tables.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr  # run python scripts/config_tables.py


def test_a_table_row_can_explain_several_keys() -> None:
    section = Section(
        "s",
        (
            Key("low", "number", default=0.0, docs="the bounds"),
            Key("high", "number", default=0.5, joins_row=True),
            Key("name", "string", required=True, docs="a name"),
            Key("mode", "choice", default="a", choices=("a", "b"), docs="how"),
        ),
    )
    assert markdown_table(section).splitlines()[2:] == [
        "| `[s] low`, `high` | 0, 0.5 | the bounds |",
        "| `name` | required | a name |",
        '| `mode` | `"a"` | how |',
    ]


@pytest.mark.parametrize(
    "value", [1e-5, 0.0, 2, 'a "quoted" \\ path', ("q_proj", "v_proj"), {"A": "1"}, {}, True]
)
def test_toml_values_read_back_as_written(value: Any) -> None:
    text = toml_value(value)
    read = tomllib.loads(f"v = {text}")["v"]
    assert read == (list(value) if isinstance(value, tuple) else value)
    assert type(read) is (list if isinstance(value, tuple) else type(value))


# --- the checks each declaration asks for, through the loaders (and --set) ------------------------


def _load(tmp_path: Path, section: Section, setting: str, *beside: str) -> object:
    """Load the scaffold's config of ``section`` with ``section.setting`` set by ``--set``,
    and the ``beside`` flags (settings it needs) before it."""
    if not (tmp_path / "rollouts" / "r").is_dir():
        scaffold_rollout(tmp_path, "r")
    override = f"{section.name}.{setting}"
    if section is EVALUATION:
        return load_eval_config(tmp_path / "configs" / "eval" / "r.toml", [override])
    # A LoRA rank, so that the LoRA options may be set; the vLLM engine, so that [vllm] may.
    base = ["training.lora_rank=4", *(["training.engine=vllm"] if section is VLLM else [])]
    return load_train_config(
        tmp_path / "configs" / "training" / "r.toml", [*base, *beside, override]
    )


def _error(tmp_path: Path, section: Section, setting: str) -> str:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, section, setting)
    message = str(info.value)
    assert f", --set {section.name}.{setting}: " in message, "the flag is named"
    return message.split(": ", 1)[1]


def _keys(kind: str) -> list[Any]:
    return [
        pytest.param(section, key, id=f"{section.name}.{key.name}")
        for section in (EVALUATION, TRAINING, VLLM)
        for key in section.keys
        if key.kind == kind
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


#: Keys that the update's own rules (`GrpoConfig`) check beyond their kind and bound: a value
#: they take, and the flags they need beside them (the rules are tested in tests/train).
_RULED: dict[str, tuple[str, tuple[str, ...]]] = {
    "training.group_size": ("2", ()),
    "training.token_budget": ("2", ()),
    "training.dual_clip": ("3.5", ()),
    "training.tis_cap": ("1.5", ()),
    "training.tis_floor": ("0.5", ("training.tis_cap=2", 'training.tis_mode="token_mask"')),
    "training.tis_mode": ("", ("training.tis_cap=2",)),
}


@pytest.mark.parametrize(("section", "key"), _keys("integer") + _keys("number"))
def test_a_numeric_key_takes_the_values_its_kind_and_bound_allow(
    tmp_path: Path, section: Section, key: Key
) -> None:
    name = f"{section.name}.{key.name}"
    for value, expected in _REFUSED[key.kind]:
        assert _error(tmp_path, section, f"{key.name}={value}") == f"{name} must be {expected}"
    taken, beside = _RULED.get(name, ("1" if key.kind == "integer" else "0.5", ()))
    assert _load(tmp_path, section, f"{key.name}={taken}", *beside)
    if key.bound == "any":
        assert _load(tmp_path, section, f"{key.name}=-1")
    elif key.bound == "non-negative":
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


@pytest.mark.parametrize("section", [EVALUATION, TRAINING, VLLM], ids=lambda s: s.name)
def test_an_undeclared_key_is_refused_naming_the_declared_ones(
    tmp_path: Path, section: Section
) -> None:
    message = _error(tmp_path, section, "bogus=1")
    assert message == (
        f"unknown key '{section.name}.bogus'; [{section.name}] accepts " + ", ".join(section.names)
    )


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("lr", "learning_rate"),  # the initials of its words
        ("learning_rte", "learning_rate"),  # a near spelling
        ("num_generations", "group_size"),  # TRL's name
        ("kl_coef", "kl_beta"),  # verl's
    ],
)
def test_a_near_miss_key_is_answered_with_the_key_meant(
    tmp_path: Path, written: str, meant: str
) -> None:
    message = _error(tmp_path, TRAINING, f"{written}=1")
    assert message.startswith(
        f"unknown key 'training.{written}'; did you mean 'training.{meant}'? [training] accepts "
    )


def test_a_near_miss_section_is_answered_with_the_section_meant(tmp_path: Path) -> None:
    scaffold_rollout(tmp_path, "r")
    with pytest.raises(ConfigError) as info:
        load_train_config(tmp_path / "configs" / "training" / "r.toml", ["traning.steps=3"])
    assert "unknown section [traning]; did you mean [training]? " in str(info.value)


def test_a_group_of_one_is_refused_it_can_never_have_a_gradient(tmp_path: Path) -> None:
    message = _error(tmp_path, TRAINING, "group_size=1")
    assert message.startswith("training.group_size must be at least 2, got 1: ")
