"""Tests for the eval TOML (osmosis_ai.eval.config)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.eval import EvalConfig, EvaluationConfig, ExperimentConfig, load_eval_config

EXPERIMENT = """\
[experiment]
rollout = "echo"
entrypoint = "main.py"
model_path = "openai/gpt-5-mini"
dataset = "data/rows.jsonl"
"""


def write_rollout(workspace: Path, name: str = "echo") -> None:
    """The rollout folder and entry point a config names must exist."""
    (workspace / "rollouts" / name).mkdir(parents=True, exist_ok=True)
    (workspace / "rollouts" / name / "main.py").touch()


def write_config(workspace: Path, text: str, name: str = "echo") -> Path:
    write_rollout(workspace)
    path = workspace / "configs" / "eval" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load(tmp_path: Path, text: str) -> EvalConfig:
    return load_eval_config(write_config(tmp_path, text))


def load_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    return str(info.value)


# --- a valid file ---------------------------------------------------------------------------------


def test_full_config_round_trips_every_section(tmp_path):
    path = write_config(
        tmp_path,
        EXPERIMENT
        + """
        [evaluation]
        limit = 200
        n = 3
        batch_size = 8
        pass_threshold = 0.5
        agent_workflow_timeout_s = 300
        grader_timeout_s = 12.5

        [env]
        LOG_LEVEL = "debug"
        _PRIVATE = "x"

        [secrets]
        required = ["OPENAI_API_KEY", "TOOL_TOKEN"]

        [advanced]
        anything = { goes = [1, 2] }
        """,
    )
    config = load_eval_config(path)
    assert config == EvalConfig(
        path=path,
        workspace=tmp_path,
        experiment=ExperimentConfig(
            rollout="echo",
            entrypoint="main.py",
            model_path="openai/gpt-5-mini",
            dataset=tmp_path / "data" / "rows.jsonl",
        ),
        evaluation=EvaluationConfig(
            limit=200,
            n=3,
            batch_size=8,
            pass_threshold=0.5,
            agent_timeout_sec=300.0,
            grader_timeout_sec=12.5,
        ),
        env={"LOG_LEVEL": "debug", "_PRIVATE": "x"},
        secrets=("OPENAI_API_KEY", "TOOL_TOKEN"),
        advanced={"anything": {"goes": [1, 2]}},
    )
    assert config.rollout_dir == tmp_path / "rollouts" / "echo"
    assert config.entrypoint_path == tmp_path / "rollouts" / "echo" / "main.py"


def test_optional_sections_take_their_defaults(tmp_path):
    config = load(tmp_path, EXPERIMENT)
    assert config.evaluation == EvaluationConfig(
        limit=None,
        n=1,
        batch_size=None,
        pass_threshold=1.0,
        agent_timeout_sec=450.0,
        grader_timeout_sec=150.0,
    )
    assert config.env == {}
    assert config.secrets == ()
    assert config.advanced == {}


def test_empty_secrets_list_is_allowed(tmp_path):
    assert load(tmp_path, EXPERIMENT + "[secrets]\nrequired = []\n").secrets == ()


@pytest.mark.parametrize("limit", [0, -1])
def test_non_positive_limit_means_all_rows(tmp_path, limit):
    config = load(tmp_path, EXPERIMENT + f"[evaluation]\nlimit = {limit}\n")
    assert config.evaluation.limit is None


def test_bundled_example_config_loads():
    example = Path(__file__).parents[2] / "examples" / "calculator" / "configs" / "eval"
    config = load_eval_config(example / "calculator.toml")
    assert config.experiment.model_path == "embedded"
    assert config.experiment.dataset.is_file()


# --- paths ----------------------------------------------------------------------------------------


def test_dataset_is_resolved_against_the_directory_holding_configs(tmp_path):
    config = load(tmp_path, EXPERIMENT.replace("data/rows.jsonl", "../shared/rows.csv"))
    assert config.workspace == tmp_path
    assert config.experiment.dataset == tmp_path.parent / "shared" / "rows.csv"


def test_dataset_is_resolved_against_the_toml_directory_without_configs(tmp_path):
    path = tmp_path / "elsewhere" / "eval.toml"
    path.parent.mkdir()
    path.write_text(EXPERIMENT, encoding="utf-8")
    write_rollout(path.parent)
    config = load_eval_config(path)
    assert config.workspace == tmp_path / "elsewhere"
    assert config.experiment.dataset == tmp_path / "elsewhere" / "data" / "rows.jsonl"


def test_absolute_dataset_path_is_kept(tmp_path):
    target = tmp_path / "abs" / "rows.parquet"
    config = load(tmp_path, EXPERIMENT.replace("data/rows.jsonl", str(target)))
    assert config.experiment.dataset == target


def test_dataset_extension_is_case_insensitive(tmp_path):
    config = load(tmp_path, EXPERIMENT.replace("data/rows.jsonl", "rows.CSV"))
    assert config.experiment.dataset.name == "rows.CSV"


def test_dataset_with_unknown_extension_is_refused(tmp_path):
    message = load_error(tmp_path, EXPERIMENT.replace("data/rows.jsonl", "multiply"))
    assert "line 5" in message
    assert "experiment.dataset" in message
    assert ".csv, .jsonl, .parquet" in message


@pytest.mark.parametrize("key", ["rollout", "entrypoint"])
@pytest.mark.parametrize("value", ["..", "a/b", "/abs/main.py", "a\\\\b", "."])
def test_rollout_and_entrypoint_must_be_single_path_segments(tmp_path, key, value):
    text = EXPERIMENT.replace(f'{key} = "', f'{key} = "{value}" #')
    message = load_error(tmp_path, text)
    assert f"experiment.{key}" in message
    assert "single path segment" in message
    assert str(tmp_path / "configs" / "eval" / "echo.toml") in message


# --- model_path -----------------------------------------------------------------------------------


def test_missing_rollout_folder_names_the_key_line_and_folder(tmp_path):
    message = load_error(tmp_path, EXPERIMENT.replace('"echo"', '"nope"'))
    assert "line 2: experiment.rollout 'nope'" in message
    assert str(tmp_path / "rollouts" / "nope") in message
    assert "osmosis rollout init nope" in message


def test_missing_entrypoint_names_the_key_line_and_file(tmp_path):
    message = load_error(tmp_path, EXPERIMENT.replace('"main.py"', '"server.py"'))
    assert "line 3: experiment.entrypoint 'server.py'" in message
    assert str(tmp_path / "rollouts" / "echo" / "server.py") in message


@pytest.mark.parametrize(
    "spec",
    [
        "embedded",
        "openai/gpt-5-mini",
        "openai:http://127.0.0.1:8000/v1",
        "openai-compatible:http://localhost:8000/v1:Qwen/Qwen3-8B",
    ],
)
def test_model_path_accepts_every_policy_spec(tmp_path, spec):
    config = load(tmp_path, EXPERIMENT.replace("openai/gpt-5-mini", spec))
    assert config.experiment.model_path == spec


@pytest.mark.parametrize("spec", ["gpt-5-mini", "openai:ftp://host", "   "])
def test_bad_model_path_names_the_field_and_line(tmp_path, spec):
    message = load_error(tmp_path, EXPERIMENT.replace("openai/gpt-5-mini", spec))
    assert "experiment.model_path" in message
    assert ", line 4:" in message


# --- required keys, unknown keys and sections -----------------------------------------------------


@pytest.mark.parametrize("key", ["rollout", "entrypoint", "model_path", "dataset"])
def test_each_experiment_key_is_required(tmp_path, key):
    text = "\n".join(line for line in EXPERIMENT.splitlines() if not line.startswith(key))
    message = load_error(tmp_path, text)
    assert f"experiment.{key} is required" in message
    assert ", line 1:" in message


def test_missing_experiment_section_is_an_error(tmp_path):
    message = load_error(tmp_path, "[evaluation]\nn = 2\n")
    assert "[experiment] section is missing" in message


def test_unknown_key_names_the_key_and_its_line(tmp_path):
    text = EXPERIMENT + "\n[evaluation]\nn = 2\n# a comment\ntimeout = 5\n"
    message = load_error(tmp_path, text)
    assert "unknown key 'evaluation.timeout'" in message
    assert ", line 10:" in message
    assert "limit, n, batch_size" in message


def test_unknown_experiment_key_is_reported_at_its_line(tmp_path):
    message = load_error(tmp_path, EXPERIMENT + 'extra = "x"\n')
    assert "unknown key 'experiment.extra'" in message
    assert ", line 6:" in message


def test_unknown_section_names_the_section_and_its_line(tmp_path):
    message = load_error(tmp_path, EXPERIMENT + "\n[local]\nworkers = 2\n")
    assert "unknown section [local]" in message
    assert ", line 7:" in message


def test_unknown_top_level_key_is_an_error(tmp_path):
    message = load_error(tmp_path, 'name = "x"\n' + EXPERIMENT)
    assert "unknown key 'name'" in message
    assert ", line 1:" in message


def test_unknown_secrets_key_is_an_error(tmp_path):
    message = load_error(tmp_path, EXPERIMENT + "[secrets]\noptional = []\n")
    assert "unknown key 'secrets.optional'" in message


def test_advanced_accepts_any_key(tmp_path):
    config = load(tmp_path, EXPERIMENT + "[advanced]\nfoo = 1\n[advanced.bar]\nbaz = true\n")
    assert config.advanced == {"foo": 1, "bar": {"baz": True}}


def test_dotted_key_inside_a_section_is_located(tmp_path):
    # Under [experiment], `evaluation.n` makes a sub-table of experiment: an unknown key there.
    message = load_error(tmp_path, EXPERIMENT + "evaluation.n = 2\n")
    assert "unknown key 'experiment.evaluation'" in message
    assert ", line 6:" in message


def test_key_inside_an_inline_table_falls_back_to_the_table_line(tmp_path):
    message = load_error(tmp_path, EXPERIMENT + "\nevaluation = { bogus = 1 }\n")
    # A key after [experiment] belongs to it, so the inline table is experiment.evaluation.
    assert "unknown key 'experiment.evaluation'" in message
    assert ", line 7:" in message


def test_top_level_inline_table_key_is_located_at_the_table(tmp_path):
    message = load_error(tmp_path, "evaluation = { n = 2, bogus = 1 }\n" + EXPERIMENT)
    assert "unknown key 'evaluation.bogus'" in message
    assert ", line 1:" in message


def test_syntax_error_reports_tomllib_position(tmp_path):
    message = load_error(tmp_path, EXPERIMENT + "n = \n")
    assert "invalid TOML" in message
    assert "line 6" in message


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_eval_config(tmp_path / "nope.toml")


# --- types and values -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("limit = 1.5", "evaluation.limit must be an integer, got a float"),
        ("n = true", "evaluation.n must be an integer, got a boolean"),
        ('batch_size = "8"', "evaluation.batch_size must be an integer, got a string"),
        ('pass_threshold = "1"', "evaluation.pass_threshold must be a number, got a string"),
        ("agent_workflow_timeout_s = [1]", "must be a number, got an array"),
        ("n = 0", "evaluation.n must be positive, got 0"),
        ("batch_size = -2", "evaluation.batch_size must be positive"),
        ("grader_timeout_s = 0", "evaluation.grader_timeout_s must be positive"),
        ("agent_workflow_timeout_s = inf", "must be finite"),
        ("pass_threshold = nan", "evaluation.pass_threshold must be finite"),
    ],
)
def test_evaluation_values_are_checked(tmp_path, line, expected):
    message = load_error(tmp_path, EXPERIMENT + f"[evaluation]\n{line}\n")
    assert expected in message
    assert ", line 7:" in message


def test_pass_threshold_accepts_integers_and_negative_numbers(tmp_path):
    config = load(tmp_path, EXPERIMENT + "[evaluation]\npass_threshold = -1\n")
    assert config.evaluation.pass_threshold == -1.0
    assert isinstance(config.evaluation.pass_threshold, float)


def test_experiment_string_types_are_checked(tmp_path):
    message = load_error(tmp_path, EXPERIMENT.replace('"main.py"', "3"))
    assert "experiment.entrypoint must be a string, got an integer" in message
    assert ", line 3:" in message


def test_section_that_is_not_a_table_is_an_error(tmp_path):
    message = load_error(tmp_path, "env = 3\n" + EXPERIMENT)
    assert "[env] must be a table, got an integer" in message


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ('lower = "x"', "env name 'lower' must match"),
        ('"1ABC" = "x"', "env name '1ABC' must match"),
        ('_OSMOSIS_ROLLOUT_PORT = "1"', "is reserved"),
        ("COUNT = 3", "env.COUNT must be a string"),
    ],
)
def test_env_names_and_values_are_checked(tmp_path, entry, expected):
    message = load_error(tmp_path, EXPERIMENT + f"[env]\nOK = 'fine'\n{entry}\n")
    assert expected in message
    assert ", line 8:" in message


@pytest.mark.parametrize(
    ("required", "expected"),
    [
        ('["_LEADING"]', "secret name '_LEADING' must match"),
        ('["lower"]', "secret name 'lower' must match"),
        ('["A", "A"]', "'A' is listed twice"),
        ('"A"', "secrets.required must be an array of strings, got a string"),
        ("[1]", "secrets.required must hold only strings, got an integer"),
        ('["SHARED"]', "'SHARED' is both a secret and an [env] variable"),
    ],
)
def test_secret_names_are_checked(tmp_path, required, expected):
    text = EXPERIMENT + '[env]\nSHARED = "x"\n[secrets]\nrequired = ' + required + "\n"
    message = load_error(tmp_path, text)
    assert expected in message
    assert ", line 9:" in message


def test_branch_and_commit_sha_are_optional_provenance(tmp_path):
    config = load(tmp_path, EXPERIMENT + 'commit_sha = "abc1234"\n')
    assert config.experiment.commit_sha == "abc1234"
    assert config.experiment.branch is None
    assert load(tmp_path, EXPERIMENT + 'branch = "main"\n').experiment.branch == "main"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('commit_sha = "xyz"', "7 to 40 hexadecimal digits"),
        ('branch = "a"\ncommit_sha = "abc1234"', "mutually exclusive"),
    ],
)
def test_commit_sha_is_checked(tmp_path, extra, expected):
    assert expected in load_error(tmp_path, EXPERIMENT + extra + "\n")


# --- --set overrides ------------------------------------------------------------------------------


def test_overrides_replace_the_files_values_and_are_checked_like_them(tmp_path):
    path = write_config(tmp_path, EXPERIMENT + "[evaluation]\nn = 2\n")
    config = load_eval_config(path, ["evaluation.n=5", "experiment.model_path=embedded"])
    assert config.evaluation.n == 5 and config.experiment.model_path == "embedded"
    with pytest.raises(ConfigError) as info:
        load_eval_config(path, ["evaluation.n=0"])
    assert str(info.value).startswith(f"{path}, --set evaluation.n=0: evaluation.n must be")
    with pytest.raises(ConfigError, match=r"--set evaluation.nn=1: unknown key 'evaluation.nn'"):
        load_eval_config(path, ["evaluation.nn=1"])
    with pytest.raises(ConfigError, match=r"--set evaluation.n: write --set section.key=value"):
        load_eval_config(path, ["evaluation.n"])
