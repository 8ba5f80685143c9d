"""``osmosis eval run`` mistakes end with one clear line and exit 2, never a traceback."""

from __future__ import annotations

import json

import pytest

from tests.eval.conftest import Workspace, rows


def _error_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("error:")]


def _write_rollout(workspace: Workspace, name: str, main: str) -> None:
    folder = workspace.root / "rollouts" / name
    folder.mkdir(parents=True)
    (folder / "main.py").write_text(main)
    workspace.rollout = name
    workspace.write_config()


@pytest.mark.parametrize(
    "name",
    [".", "..", "../outside", "{absolute}", "a/b", "x" * 300, ".locks", ""],
    ids=["dot", "dotdot", "parent", "absolute", "nested", "too-long", "hidden", "empty"],
)
async def test_bad_run_name_is_refused_before_anything_is_written(
    workspace: Workspace, name: str
) -> None:
    absolute = workspace.root.parent / "absolute-run"
    code, out = await workspace.run("--name", name.format(absolute=absolute))
    assert code == 2, out
    assert "Traceback" not in out
    (line,) = _error_lines(out)
    assert "--name" in line
    assert not (workspace.root / ".osmosis").exists()
    assert not (workspace.root / "outside").exists()
    assert not absolute.exists()


async def test_fresh_with_name_dot_archives_nothing(workspace: Workspace) -> None:
    assert (await workspace.run("--name", "keep"))[0] == 0
    code, out = await workspace.run("--name", ".", "--fresh")
    assert code == 2 and len(_error_lines(out)) == 1, out
    assert [p.name for p in workspace.run_dirs()] == ["keep"]


async def test_missing_rollout_folder_is_a_config_error_and_creates_no_run(
    workspace: Workspace,
) -> None:
    workspace.rollout = "nope"
    workspace.write_config()
    code, out = await workspace.run()
    assert code == 2, out
    assert "Traceback" not in out
    (line,) = _error_lines(out)
    assert "experiment.rollout 'nope'" in line and "rollouts/nope" in line
    assert not (workspace.root / ".osmosis").exists()


async def test_missing_entrypoint_is_a_config_error(workspace: Workspace) -> None:
    (workspace.root / "rollouts" / "empty").mkdir()
    workspace.rollout = "empty"
    workspace.write_config()
    code, out = await workspace.run()
    assert code == 2, out
    (line,) = _error_lines(out)
    assert "experiment.entrypoint 'main.py'" in line
    assert not (workspace.root / ".osmosis").exists()


async def test_unwritable_output_root_is_one_line(workspace: Workspace) -> None:
    blocker = workspace.root / "a-file"
    blocker.write_text("not a folder")
    code, out = await workspace.run("-o", str(blocker / "out"))
    assert code == 2, out
    assert "Traceback" not in out
    (line,) = _error_lines(out)
    assert str(blocker / "out") in line and "-o" in line


async def test_brackets_in_messages_are_printed_verbatim(workspace: Workspace) -> None:
    workspace.config.write_text("[evaluation]\nn = 1\n")
    code, out = await workspace.run()
    assert code == 2, out
    (line,) = _error_lines(out)
    assert "the [experiment] section is missing" in line


async def test_markup_like_server_output_does_not_crash_the_cli(workspace: Workspace) -> None:
    _write_rollout(workspace, "bad", 'raise RuntimeError("config value [/etc/app] is bad")\n')
    code, out = await workspace.run("--name", "bad")
    assert code == 1, out
    assert "MarkupError" not in out
    assert "RuntimeError: config value [/etc/app] is bad" in out


async def test_entrypoint_that_never_serves_says_what_it_must_do(workspace: Workspace) -> None:
    _write_rollout(workspace, "quiet", "print('imported, but no server')\n")
    code, out = await workspace.run("--name", "quiet")
    assert code == 1, out
    assert "exited with status 0" in out and "_OSMOSIS_ROLLOUT_PORT" in out
    assert "docs/eval.md" in out and "imported, but no server" in out
    assert "re-run to resume" not in out


async def test_upstream_timeout_flag_reaches_the_gateway(workspace: Workspace) -> None:
    workspace.stub.delay_sec = 5  # answered in time under the default 600 s
    code, out = await workspace.run("--name", "slow", "--upstream-timeout", "0.5", "--json")
    assert code == 1, out
    payload = json.loads(out[out.index("{") :])
    assert "upstream timed out after 0.5s" in payload["halted"]


async def test_every_rollout_failing_exits_3_with_one_summary_line(workspace: Workspace) -> None:
    # A workflow that always raises: the table's pass rate of 0 must not read as a result.
    workspace.write_rows(rows(3, metadata={"do": "raise"}))
    code, out = await workspace.run("--name", "broken")
    assert code == 3, out
    last = out.rstrip().splitlines()[-1]
    assert last == (
        "error: 3 of 3 rollouts failed (agent_error 3); first: workflow raised "
        "RuntimeError: injected tool failure"
    ), out
    assert "Traceback" not in out
    # Resuming the finished run reports the same, from its journal.
    code, out = await workspace.run("--name", "broken")
    assert code == 3 and out.rstrip().splitlines()[-1] == last, out


async def test_some_rollouts_failing_exit_0_unless_strict(workspace: Workspace) -> None:
    workspace.write_rows([*rows(2), *rows(1, metadata={"do": "raise"})])
    code, out = await workspace.run("--name", "partial")
    assert code == 0 and not _error_lines(out), out
    code, out = await workspace.run("--name", "partial", "--strict", "--json")
    assert code == 3, out
    assert out.rstrip().splitlines()[-1] == (
        "error: 1 of 3 rollouts failed (agent_error 1); first: workflow raised "
        "RuntimeError: injected tool failure"
    ), out
