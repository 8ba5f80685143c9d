"""``osmosis eval run`` end to end: real CLI process, rollout server, gateway, stub model."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from osmosis_ai.eval.journal import STORAGE_ERROR, read_records
from osmosis_ai.eval.run_dir import run_lock
from osmosis_ai.testing import ChatStub
from osmosis_ai.viewer.runs import run_items
from tests.eval.conftest import Workspace, rows

pytestmark = pytest.mark.slow  # left out of make test-fast


def _processes_in(root: Path) -> list[int]:
    """Live processes whose working directory is inside ``root`` (leaked servers)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if Path(proc / "cwd").resolve().is_relative_to(root):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


async def _no_processes_in(root: Path) -> None:
    async with asyncio.timeout(15):
        while _processes_in(root):  # noqa: ASYNC110 -- another process's exit
            await asyncio.sleep(0.05)


def _index(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run_dir / "index.jsonl").read_text().splitlines()]


async def test_run_writes_every_output_and_the_results_table(workspace: Workspace) -> None:
    code, out = await workspace.run()
    assert code == 0, out
    assert "pass rate" in out and "100.0%" in out
    (run_dir,) = workspace.run_dirs()
    # The header's paths whole, on one line each, however long (a user copies them).
    assert f"Output        {run_dir}\n" in out and f"({workspace.dataset})\n" in out
    for name in ("manifest.json", "events.jsonl", "logs.txt", "index.jsonl", "summary.jsonl",
                 "progress.json", "metrics.json"):  # fmt: skip
        assert (run_dir / name).is_file(), name
    index = _index(run_dir)
    assert [(r["row_index"], r["run_index"], r["status"], r["reward"]) for r in index] == [
        (i, 0, "success", 1.0) for i in range(4)
    ]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "finished"
    assert metrics["summary"]["pass_rate"] == 1.0 and metrics["summary"]["tokens_used"] == 40
    trajectory = json.loads((run_dir / "trajectories" / "row_0_run_0.json").read_text())
    assert trajectory["steps"][-1]["metrics"]["prompt_tokens"] == 7  # from the gateway's records
    assert (run_dir / "events.jsonl").stat().st_mode & 0o777 == 0o600
    assert all((run_dir / "rollout_trials" / str(r["rollout_id"])).is_dir() for r in index)


async def test_rerun_resumes_and_runs_nothing(workspace: Workspace) -> None:
    assert (await workspace.run())[0] == 0
    requests = len(workspace.stub.requests)
    code, out = await workspace.run("--json")
    payload = json.loads(out[out.index("{") :])
    assert code == 0 and payload["dispatched"] == 0 and payload["resumed"] == 4
    assert len(workspace.stub.requests) == requests
    assert all(r.get("resumed") for r in _index(Path(payload["output_path"])))


async def test_grader_crash_and_removed_sample(workspace: Workspace) -> None:
    workspace.write_rows(
        [*rows(1), *rows(1, metadata={"do": "crash_grader"}), *rows(1, metadata={"do": "remove"})]
    )
    code, out = await workspace.run()
    assert code == 0, out
    (run_dir,) = workspace.run_dirs()
    index = _index(run_dir)
    assert [r["status"] for r in index] == ["success", "failed", "skipped"]
    assert index[1]["error_type"] == "grader_error" and "reward" not in index[2]
    assert "error_type=grader_error: grader raised RuntimeError: grader crashed" in out


async def test_identical_failures_are_one_line_with_their_count(workspace: Workspace) -> None:
    workspace.write_rows(rows(3, metadata={"do": "crash_grader"}))
    code, out = await workspace.run()
    assert code == 3, out
    [line] = [line for line in out.splitlines() if "error_type=" in line]
    assert line.startswith(
        "  3 rollouts (first row 0 run 0): error_type=grader_error: grader raised RuntimeError"
    )


async def test_a_workflow_that_never_calls_the_model_is_warned_about(workspace: Workspace) -> None:
    workspace.write_rows([*rows(1), *rows(2, metadata={"do": "no_call"})])
    code, out = await workspace.run()
    assert code == 0, out
    warning = out[out.index("warning: ") :]
    assert " ".join(warning.split()).startswith(
        "warning: 2 of 3 rollouts made no model call through the gateway, so their rewards say "
        "nothing about the model: the workflow must call "
        "get_rollout_context().chat_completions_url"
    )
    code, out = await workspace.run("--json", "--fresh")
    assert json.loads(out[out.index("{") :])["warnings"][0].startswith("2 of 3 rollouts")


async def test_changed_inputs_are_refused_by_name_and_fresh_archives(workspace: Workspace) -> None:
    assert (await workspace.run("--name", "mine"))[0] == 0
    workspace.write_rows(rows(5))
    code, out = await workspace.run("--name", "mine")
    assert code == 2 and "changed: dataset" in out and "--fresh" in out
    code, out = await workspace.run("--name", "mine", "--fresh")
    assert code == 0, out
    names = [p.name for p in workspace.run_dirs()]
    assert "mine" in names and any(name.startswith("mine.archive-") for name in names)
    assert len(_index(workspace.root / ".osmosis" / "evals" / "mine")) == 5


async def test_model_option_replaces_the_configs_model_path(workspace: Workspace) -> None:
    async with ChatStub() as other:
        model = f"openai:{other.base_url}:other-model"
        code, out = await workspace.run("--name", "other", "--model", model)
        assert code == 0, out
        called = len(other.requests)
    assert called >= 3 and all(r["body"]["model"] == "other-model" for r in other.requests)
    manifest = json.loads((workspace.root / ".osmosis/evals/other/manifest.json").read_text())
    assert manifest["inputs"]["model_path"] == model
    # Another model is another run: resuming this one with the config's model is refused.
    code, out = await workspace.run("--name", "other")
    assert code == 2 and "changed: model_path" in out, out
    code, out = await workspace.run("--model", "nonsense:spec")
    assert code == 2 and "nonsense" in out, out


async def test_retry_failed_reruns_only_failures(workspace: Workspace) -> None:
    workspace.write_rows([*rows(2), *rows(1, metadata={"do": "crash_grader"})])
    assert (await workspace.run("--name", "r"))[0] == 0
    code, out = await workspace.run("--name", "r", "--retry-failed", "--json")
    payload = json.loads(out[out.index("{") :])
    assert code == 0 and payload["dispatched"] == 1 and payload["resumed"] == 2


async def test_second_runner_is_refused(workspace: Workspace) -> None:
    with run_lock(workspace.root / ".osmosis" / "evals", "busy"):
        code, out = await workspace.run("--name", "busy")
    assert code == 2 and "already holds run 'busy'" in out


async def test_dead_rollout_server_halts_with_work_pending(workspace: Workspace) -> None:
    workspace.write_rows([*rows(2), *rows(1, metadata={"do": "kill_server"}), *rows(3)])
    workspace.write_config(evaluation="batch_size = 1")
    code, out = await workspace.run("--name", "dead")
    assert code == 1 and "rollout server exited with status 3" in out
    run_dir = workspace.root / ".osmosis" / "evals" / "dead"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "incomplete"
    assert len(_index(run_dir)) == 2  # the rest stays pending, not failed


def _journal_lines(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


async def test_a_full_disk_stops_the_run_in_one_line_and_resume_redoes_what_was_lost(
    workspace: Workspace, small_filesystem: Path
) -> None:
    fill = {"do": "fill_disk", "path": str(small_filesystem / "filler"),
            "marker": str(workspace.root / "filled")}  # fmt: skip
    workspace.write_rows([*rows(2), *rows(1, metadata=fill), *rows(3)])
    workspace.write_config(evaluation="batch_size = 1")
    code, out = await workspace.run("--name", "full", "-o", str(small_filesystem))
    assert code == 1, out
    assert "Traceback" not in out and "Logging error" not in out and "Errno" not in out
    (stopped,) = [line for line in out.splitlines() if "No space left on device" in line]
    assert stopped.startswith("stopped early:") and "free space" in stopped, stopped
    run_dir = small_filesystem / "full"
    done = read_records(run_dir / "events.jsonl")
    # The item whose trajectory could not be written is not done.
    assert (2, 0) not in done or done[2, 0].error_type == STORAGE_ERROR
    assert all(record.status == "success" for key, record in done.items() if key != (2, 0))

    (small_filesystem / "filler").unlink()
    code, out = await workspace.run("--name", "full", "-o", str(small_filesystem))
    assert code == 0, out
    lines = _journal_lines(run_dir)
    terminal = [line for line in lines if line.get("error_type") != STORAGE_ERROR]
    assert sorted((line["row_index"], line["run_index"]) for line in terminal) == [
        (row, 0) for row in range(6)
    ]
    assert all(line["status"] == "success" for line in terminal)
    for line in terminal:
        assert (run_dir / "rollout_trials" / str(line["rollout_id"]) / "trajectory.json").is_file()
        assert (run_dir / "trajectories" / f"row_{line['row_index']}_run_0.json").is_file()


async def test_a_deeply_nested_row_fails_alone_named_by_file_and_row(
    workspace: Workspace,
) -> None:
    deep: dict[str, object] = {}
    for _ in range(300):
        deep = {"k": deep}
    workspace.write_rows([*rows(1), *rows(1, metadata=deep), *rows(1)])
    code, out = await workspace.run("--name", "deep")
    assert code == 0, out
    run_dir = workspace.root / ".osmosis" / "evals" / "deep"
    assert [r["status"] for r in _index(run_dir)] == ["success", "failed", "success"]
    record = read_records(run_dir / "events.jsonl")[1, 0]
    assert record.error_type == "validation_error" and record.error_message is not None
    assert record.error_message.startswith(f"{workspace.dataset}, line 2: dataset row 1")
    assert "deeper than 64 levels" in record.error_message
    assert "rollout_trials" not in out  # nothing was sent, so no folder to point at
    assert f"{workspace.dataset}, line 2: dataset row 1" in out
    code, out = await workspace.run("--name", "deep", "--json")
    assert code == 0 and json.loads(out[out.index("{") :])["dispatched"] == 0


async def test_an_oversized_row_records_what_was_too_large_and_the_limit(
    workspace: Workspace,
) -> None:
    workspace.write_rows([*rows(1), {"user_prompt": "x" * (33 * 1024 * 1024), "label": "x"}])
    code, out = await workspace.run("--name", "big")
    assert code == 0, out
    run_dir = workspace.root / ".osmosis" / "evals" / "big"
    record = read_records(run_dir / "events.jsonl")[1, 0]
    assert record.status == "failed" and record.error_type == "rollout_protocol_error"
    assert record.error_message is not None
    assert "413" in record.error_message and "over the rollout server's 32 MiB limit" in (
        record.error_message
    )
    assert not (run_dir / "rollout_trials" / record.rollout_id).exists()
    assert "rollout_trials" not in out and "32 MiB limit" in out
    # The viewer's items (its rollout page shows the item's error) carry the message.
    (item,) = [item for item in run_items(run_dir) if item["row_index"] == 1]
    assert item["error_message"] == record.error_message


async def test_bad_dataset_row_is_reported_with_file_row_and_column(workspace: Workspace) -> None:
    workspace.write_rows([*rows(1), {"user_prompt": "no answer"}])
    code, out = await workspace.run()
    assert code == 2
    assert "rows.jsonl" in out and "row 1" in out and "ground_truth" in out


@pytest.mark.parametrize("trial", range(10))
async def test_kill_9_never_loses_or_duplicates_a_record(workspace: Workspace, trial: int) -> None:
    workspace.write_rows(rows(12))
    workspace.write_config(evaluation="batch_size = 2")
    workspace.stub.delay_sec = 0.25
    process = await workspace.start("--name", "k")
    run_dir = workspace.root / ".osmosis" / "evals" / "k"
    journal = run_dir / "events.jsonl"
    wanted = random.Random(trial).randint(0, 8)  # records journaled before the kill
    async with asyncio.timeout(60):
        while not journal.exists() or journal.read_text().count("\n") < wanted:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    await asyncio.sleep(random.Random(trial).uniform(0, 0.25))
    process.kill()  # SIGKILL: no cleanup of any kind
    await process.wait()
    await _no_processes_in(workspace.root)  # its rollout server follows it
    before = journal.read_text()
    workspace.stub.delay_sec = 0
    code, out = await workspace.run("--name", "k")
    assert code == 0, out
    index = _index(run_dir)
    assert [(r["row_index"], r["run_index"]) for r in index] == [(i, 0) for i in range(12)]
    lines = before.splitlines()
    if before and not before.endswith("\n"):
        lines = lines[:-1]  # a partial last line was never acknowledged
    final = {r["row_index"]: r["rollout_id"] for r in index}
    for record in map(json.loads, lines):  # a journaled result is never run again
        assert final[record["row_index"]] == record["rollout_id"]
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    assert len({r["row_index"] for r in records}) == len(records) == 12  # no duplicates


async def test_ctrl_c_leaves_in_flight_work_pending_and_stops_the_server(
    workspace: Workspace,
) -> None:
    import signal

    workspace.write_rows(rows(8))
    workspace.write_config(evaluation="batch_size = 2")
    workspace.stub.delay_sec = 0.5
    process = await workspace.start("--name", "c")
    journal = workspace.root / ".osmosis" / "evals" / "c" / "events.jsonl"
    async with asyncio.timeout(60):
        while not journal.exists() or journal.read_text().count("\n") < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    process.send_signal(signal.SIGINT)
    async with asyncio.timeout(60):
        out, _ = await process.communicate()
    assert process.returncode == 130, out.decode()
    assert b"pending" in out
    assert not _processes_in(workspace.root)
    run_dir = journal.parent
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "incomplete"
    done = _index(run_dir)
    assert 2 <= len(done) < 8 and all(r["status"] == "success" for r in done)
    workspace.stub.delay_sec = 0
    code, _ = await workspace.run("--name", "c")
    assert code == 0 and len(_index(run_dir)) == 8


async def test_configured_secrets_never_reach_the_log(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = "canary-7f3e"  # short on purpose: configured secrets are scrubbed at any length
    monkeypatch.setenv("PROBE_SECRET", canary)
    workspace.write_rows(rows(1, metadata={"do": "print_secret"}))
    workspace.write_config(evaluation='[secrets]\nrequired = ["PROBE_SECRET"]')
    code, out = await workspace.run("--name", "s")
    assert code == 0, out
    run_dir = workspace.root / ".osmosis" / "evals" / "s"
    log = (run_dir / "logs.txt").read_text()
    assert "the secret is [REDACTED]" in log
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert canary not in path.read_text(errors="replace"), path


async def test_pass_at_k_over_two_runs_matches_the_hand_computation(workspace: Workspace) -> None:
    # Two rows the stub answers right, one it answers wrong, two runs each:
    # pass@1 = mean(2/2, 2/2, 0/2) = 2/3 and pass@2 = mean(1, 1, 0) = 2/3.
    workspace.write_rows([*rows(2), {"user_prompt": "say nothing", "ground_truth": "absent"}])
    code, out = await workspace.run("--n", "2", "--name", "k2")
    assert code == 0, out
    assert "Runs per row" in out and "pass@2" in out
    summary = json.loads((workspace.root / ".osmosis/evals/k2/metrics.json").read_text())["summary"]
    assert summary["n_runs"] == 2 and summary["total_samples"] == 6
    assert summary["pass_at_k"] == [
        {"k": 1, "value": pytest.approx(2 / 3)},
        {"k": 2, "value": pytest.approx(2 / 3)},
    ]


async def test_live_pass_counter_uses_the_configured_pass_threshold(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rewards 1.0, 0.6 and 0.2 with pass_threshold 0.5: two pass, in the table and live.
    workspace.write_rows([*rows(1), *rows(1, metadata={"reward": 0.6}),
                          *rows(1, metadata={"reward": 0.2})])  # fmt: skip
    workspace.write_config(evaluation="pass_threshold = 0.5\nbatch_size = 1")
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich draws its live progress bar
    code, out = await workspace.run("--name", "live")
    assert code == 0, out
    assert "66.7% (reward ≥ 0.5)" in out  # the final table
    assert "pass 2 · failed 0" in out, out  # the live counter agrees with it


async def test_policy_key_reaches_the_model_and_nothing_else(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OSMOSIS_POLICY_API_KEY", "sk-policy-31f4")
    workspace.write_rows(rows(1))
    code, out = await workspace.run("--name", "p")
    assert code == 0, out
    assert workspace.stub.requests[-1]["headers"]["authorization"] == "Bearer sk-policy-31f4"
    for path in (workspace.root / ".osmosis" / "evals" / "p").rglob("*"):
        if path.is_file():
            assert "sk-policy-31f4" not in path.read_text(errors="replace"), path


async def test_long_server_output_lines_do_not_stall_the_server(workspace: Workspace) -> None:
    workspace.write_rows([*rows(1, metadata={"do": "print_long"}), *rows(2)])
    code, out = await workspace.run("--name", "long")
    assert code == 0, out
    log = (workspace.root / ".osmosis" / "evals" / "long" / "logs.txt").read_text()
    assert "[line truncated]" in log and "line 1999" in log


async def test_ray_backend_produces_the_same_layout(workspace: Workspace, ray_cluster: str) -> None:
    workspace.write_rows([*rows(3), *rows(1, metadata={"do": "crash_grader"})])
    assert (await workspace.run("--name", "local"))[0] == 0
    code, out = await workspace.run("--name", "on-ray", "--backend", f"ray:{ray_cluster}")
    assert code == 0, out
    local, on_ray = (workspace.root / ".osmosis" / "evals" / n for n in ("local", "on-ray"))
    assert sorted(p.name for p in local.iterdir() if p.name != ".locks") == sorted(
        p.name for p in on_ray.iterdir() if p.name != ".locks"
    )
    strip = ("rollout_id", "duration_ms")

    def comparable(run_dir: Path) -> list[dict[str, object]]:
        return [{k: v for k, v in row.items() if k not in strip} for row in _index(run_dir)]

    assert comparable(local) == comparable(on_ray)
    summaries = [json.loads((d / "metrics.json").read_text())["summary"] for d in (local, on_ray)]
    assert summaries[0] == summaries[1]
    assert "rollouts run on Ray executor actors" in (on_ray / "logs.txt").read_text()
    assert "rollouts run on Ray" not in (local / "logs.txt").read_text()


async def test_unknown_backend_is_refused(workspace: Workspace) -> None:
    code, out = await workspace.run("--backend", "kubernetes")
    assert code == 2 and "--backend 'kubernetes'" in out


async def test_the_rollout_server_fsyncs_each_trajectory_the_journal_counts(
    workspace: Workspace, tmp_path: Path
) -> None:
    # A journaled item promises its trajectory.json: the runner's server must flush it.
    workspace.write_rows(rows(2))
    workspace.write_config()
    log = tmp_path / "fsyncs.log"
    trace = ("strace", "-f", "-qq", "-y", "-e", "trace=fsync", "-o", str(log))
    code, out = await workspace.run("--name", "d", wrapper=trace)
    assert code == 0, out
    flushed = [line for line in log.read_text().splitlines() if "trajectory.json" in line]
    # strace names the fd's file (-y): the temporary file, before its rename.
    assert len(flushed) == 2 and all(".tmp>" in line for line in flushed), flushed
