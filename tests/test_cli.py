"""The rlq command: list, params, run (run folders, failures, resume) and every bad input."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli, write_tiny_notebook


def test_list_shows_description_and_presets(tiny_notebooks):
    result = run_cli("list")
    assert result.returncode == 0, result.stderr
    assert "tiny" in result.stdout and "Tiny: a test experiment" in result.stdout
    assert "quick (5 s)" in result.stdout and "paper (6 s)" in result.stdout


def test_list_real_registry_has_baseline():
    result = run_cli("list")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("baseline_rl")


def test_params_shows_types_defaults_comments(tiny_notebooks):
    result = run_cli("params", "tiny")
    assert result.returncode == 0, result.stderr
    lines = {
        line.split()[0]: line
        for line in result.stdout.splitlines()[2:]
        if line and not line.startswith("preset")
    }
    assert lines["x"].split()[1:3] == ["int", "1"] and "an int" in lines["x"]
    assert lines["scale"].split()[1:3] == ["float", "0.5"]
    assert lines["label"].split()[1:3] == ["str", "'a'"]
    assert lines["sizes"].split()[1] == "list"
    assert "preset quick [5 s]: x=2" in result.stdout


@pytest.mark.slow
def test_run_creates_run_folder_with_params_notebook_results(tiny_notebooks, tmp_path):
    out = tmp_path / "out"
    result = run_cli(
        "run", "tiny", "--preset", "paper", "-p", "x", "5", "-p", "label", "b", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    run_dir = out / "tiny" / result.stdout.strip().splitlines()[-1].rsplit("/", 1)[-1]
    assert result.stdout.strip().splitlines()[-1] == str(run_dir.resolve())
    assert run_dir.parent == out / "tiny" and len(list(run_dir.parent.iterdir())) == 1
    params = json.loads((run_dir / "params.json").read_text())
    # -p wins over the preset (x), the preset over defaults (scale), defaults stay (flag)
    assert params == {"x": 5, "scale": 2.0, "label": "b", "flag": False, "sizes": [1, 2], "fail": False}
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "ok" and results["experiment"] == "tiny" and results["preset"] == "paper"
    assert results["total"] == pytest.approx(10.0) and results["label"] == "b" and results["n_sizes"] == 2
    executed = json.loads((run_dir / "output.ipynb").read_text())
    assert any("injected-parameters" in c["metadata"].get("tags", []) for c in executed["cells"])
    # name format: <UTC timestamp>-<short id>
    stamp, short_id = run_dir.name.split("-")
    assert len(stamp) == 16 and stamp.endswith("Z") and len(short_id) == 6


@pytest.mark.slow
def test_failed_run_keeps_folder_with_error_and_exits_nonzero(tiny_notebooks, tmp_path):
    out = tmp_path / "out"
    result = run_cli("run", "tiny", "-p", "fail", "true", "--out", str(out))
    assert result.returncode == 1
    run_dir = next((out / "tiny").iterdir())
    assert result.stdout.strip().splitlines()[-1] == str(run_dir.resolve())
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "failed"
    assert "RuntimeError" in results["error"] and "asked to fail" in results["error"]
    assert results["total"] == pytest.approx(0.5)  # recorded before the failure, kept
    assert (run_dir / "output.ipynb").exists()


@pytest.mark.slow
def test_resume_reruns_failed_folder_and_archives_previous_attempt(tiny_notebooks, tmp_path):
    out = tmp_path / "out"
    assert run_cli("run", "tiny", "-p", "fail", "true", "--out", str(out)).returncode == 1
    run_dir = next((out / "tiny").iterdir())
    # the notebook changes under the run (fixed code), the run keeps its parameters except through its file
    params = json.loads((run_dir / "params.json").read_text())
    params["fail"] = False
    (run_dir / "params.json").write_text(json.dumps(params))
    result = run_cli("run", "--resume", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert json.loads((run_dir / "results.json").read_text())["status"] == "ok"
    archived = json.loads((run_dir / "attempts" / "1" / "results.json").read_text())
    assert archived["status"] == "failed"
    assert len(list((out / "tiny").iterdir())) == 1  # resumed in place, no new folder
    again = run_cli("run", "--resume", str(run_dir))
    assert again.returncode == 2 and "finished successfully" in again.stderr
    # --rerun analyses a finished run again in place (the notebook changed), keeping the earlier results
    first = json.loads((run_dir / "results.json").read_text())
    rerun = run_cli("run", "--resume", str(run_dir), "--rerun")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads((run_dir / "attempts" / "2" / "results.json").read_text()) == first
    assert json.loads((run_dir / "results.json").read_text())["total"] == first["total"]
    assert run_cli("run", "tiny", "--rerun").returncode == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "nosuch"], "unknown experiment 'nosuch'"),
        (["run", "tiny", "-p", "nosuch", "1"], "no parameter 'nosuch'"),
        (["run", "tiny", "-p", "x", "1.5"], "parameter 'x' expects int"),
        (["run", "tiny", "-p", "scale", "abc"], "parameter 'scale' expects float"),
        (["run", "tiny", "-p", "flag", "maybe"], "parameter 'flag' expects bool"),
        (["run", "tiny", "-p", "sizes", "{1: 2}"], "parameter 'sizes' expects list"),
        (["run", "tiny", "--preset", "huge"], "no preset 'huge'"),
        (["params", "nosuch"], "unknown experiment 'nosuch'"),
        (["run", "--resume", "/nonexistent/run"], "not a run folder"),
        (["runs", "nosuch"], "unknown experiment 'nosuch'"),
        (["runs", "/tmp"], "is a folder; list the runs under it with --runs /tmp"),
    ],
)
def test_bad_input_exits_2_before_any_run_folder(tiny_notebooks, tmp_path, args, message):
    out = tmp_path / "out"
    result = run_cli(*args, "--out", str(out)) if args[0] == "run" else run_cli(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert "Executing" not in result.stderr  # no kernel started
    assert not out.exists()


def test_bad_input_message_lists_the_choices(tiny_notebooks):
    result = run_cli("run", "tiny", "--preset", "huge")
    assert "quick, paper" in result.stderr
    result = run_cli("run", "nosuch")
    assert "known experiments: tiny" in result.stderr


@pytest.mark.slow
def test_missing_optional_module_refuses_run_and_reproduce_skips_it(tiny_notebooks, tmp_path):
    write_tiny_notebook(tiny_notebooks, "needs_module", requires={"rlq_no_such_module": "run `make nothing`"})
    out = tmp_path / "out"
    result = run_cli("run", "needs_module", "--preset", "quick", "--out", str(out))
    assert result.returncode == 2 and "needs rlq_no_such_module (run `make nothing`)" in result.stderr
    assert not out.exists()
    result = run_cli("reproduce", "--preset", "quick", "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "needs_module: skipped (needs rlq_no_such_module: run `make nothing`)" in result.stdout
    assert "tiny: ok" in result.stdout
    assert [p.name for p in out.iterdir()] == ["tiny"]  # no run folder for the skipped experiment


@pytest.mark.slow
def test_a_run_folder_has_one_writer_at_a_time(tiny_notebooks, tmp_path):
    """While a process holds a run folder, a second resume exits 2 naming the holder and changes nothing."""
    import os

    from rlq.experiments.run_lock import RunFolderBusy, run_folder_lock

    out = tmp_path / "out"
    assert run_cli("run", "tiny", "-p", "fail", "true", "--out", str(out)).returncode == 1
    run_dir = next((out / "tiny").iterdir())
    before = sorted(p.name for p in run_dir.iterdir())
    with run_folder_lock(run_dir):
        busy = run_cli("run", "--resume", str(run_dir))
        assert busy.returncode == 2 and f"pid {os.getpid()}" in busy.stderr, busy.stderr
        with pytest.raises(RunFolderBusy, match="in use by pid"):  # a second holder in this process too
            with run_folder_lock(run_dir):
                pass
    assert sorted(p.name for p in run_dir.iterdir()) == before  # nothing archived, nothing written
    assert json.loads((run_dir / "results.json").read_text())["status"] == "failed"
    with run_folder_lock(run_dir):  # released when its holder ends
        pass


def test_reproduce_with_an_unknown_preset_is_bad_input():
    result = run_cli("reproduce", "--preset", "quik")
    assert result.returncode == 2 and "no experiment has a preset 'quik'" in result.stderr
    assert "quick" in result.stderr  # the presets there are


@pytest.mark.slow
@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda p: p | {"x": "abc"}, "expects int"),
        (lambda p: {}, "lacks"),
    ],
)
def test_resume_checks_a_hand_edited_params_file_as_run_checks_new_ones(
    tiny_notebooks, tmp_path, edit, message
):
    out = tmp_path / "out"
    assert run_cli("run", "tiny", "-p", "fail", "true", "--out", str(out)).returncode == 1
    run_dir = next((out / "tiny").iterdir())
    params = json.loads((run_dir / "params.json").read_text())
    (run_dir / "params.json").write_text(json.dumps(edit(params)))
    result = run_cli("run", "--resume", str(run_dir))
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (run_dir / "attempts").exists()  # refused before anything was archived or started


def test_a_notebook_without_parameters_is_no_experiment(tiny_notebooks):
    """JupyterLab's empty Untitled.ipynb and a 0-byte file neither break rlq list nor run; a damaged notebook is
    still named."""
    (tiny_notebooks / "Untitled.ipynb").write_text(
        '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
    )
    listing = run_cli("list")
    assert listing.returncode == 0 and "tiny" in listing.stdout and "Untitled" not in listing.stdout
    refused = run_cli("run", "Untitled")
    assert refused.returncode == 2 and "known experiments: tiny" in refused.stderr
    (tiny_notebooks / "empty.ipynb").write_text("")  # 0 bytes: skipped, with a warning naming it
    listing = run_cli("list")
    assert listing.returncode == 0 and "tiny" in listing.stdout and "empty" not in listing.stdout
    assert (
        listing.stderr.strip()
        == f"rlq: skipping {tiny_notebooks / 'empty.ipynb'}: the file is empty (0 bytes), not a notebook"
    )
    refused = run_cli("run", "empty")
    assert refused.returncode == 2 and "unknown experiment 'empty'" in refused.stderr
    (tiny_notebooks / "broken.ipynb").write_text("{not json")
    assert "broken.ipynb" in run_cli("list").stderr


def test_report_out_may_name_a_folder(tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    result = run_cli("report", "--runs", str(tmp_path / "no_runs"), "--out", str(folder), "--format", "md")
    assert result.returncode == 0, result.stderr
    assert "<html" in (folder / "report.html").read_text().lower() and (folder / "report.md").is_file()


@pytest.mark.slow
def test_a_failed_reattempt_does_not_keep_the_previous_attempts_numbers(tiny_notebooks, tmp_path):
    from pathlib import Path

    import nbformat

    first = run_cli("run", "tiny", "-p", "fail", "True", "--out", str(tmp_path / "runs"))
    assert first.returncode == 1
    run_dir = Path(first.stdout.strip().splitlines()[-1])
    assert json.loads((run_dir / "results.json").read_text())["total"] == 0.5
    nb = nbformat.read(tiny_notebooks / "tiny.ipynb", as_version=4)
    nb.cells[3].source = 'raise RuntimeError("fails before recording")'  # the record cell
    nbformat.write(nb, tiny_notebooks / "tiny.ipynb")
    again = run_cli("run", "--resume", str(run_dir))
    assert again.returncode == 1
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "failed" and "fails before recording" in results["error"]
    assert "total" not in results  # the first attempt's number stays in its archive only
    assert json.loads((run_dir / "attempts" / "1" / "results.json").read_text())["total"] == 0.5
    assert (
        results["train_seconds"]
        > json.loads((run_dir / "attempts" / "1" / "results.json").read_text())["run_seconds"]
    )


def _budget_notebook(folder):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Budget: a test experiment with a training budget"),
        nbformat.v4.new_code_cell(
            "total_timesteps = 1000  # environment steps [min: 1]\nseed = 0  # seed\nlr = 0.1  # a rate",
            metadata={"tags": ["parameters"]},
        ),
        nbformat.v4.new_code_cell(
            'PRESETS = {"quick": {}, "paper": {"total_timesteps": 60_000}}\n'
            'PRESET_WALL_TIMES = {"quick": "about 10 s", "paper": "about 15-17 min on 2 cores (3 runs)"}',
            metadata={"tags": ["presets"]},
        ),
    ]
    nbformat.write(nb, folder / "budget.ipynb")


def test_a_run_says_its_expected_wall_time_and_one_over_30_days_needs_yes(
    tiny_notebooks, tmp_path, monkeypatch, capsys
):
    from rlq.experiments import runner
    from rlq.experiments.wall_time import stated_seconds
    from rlq.faces.cli import main

    _budget_notebook(tiny_notebooks)
    started = []
    monkeypatch.setattr(
        runner,
        "run_experiment",
        lambda name, preset, overrides, out, **kw: (
            started.append(overrides) or runner.RunOutcome(out, "ok", {})
        ),
    )
    out = tmp_path / "runs"
    run = ["run", "budget", "--preset", "paper", "--out", str(out), "--quiet"]
    assert main([*run, "-p", "total_timesteps", "1000000000000"]) == 2
    assert capsys.readouterr().err.strip() == (
        "rlq: error: estimated wall time 539 years at preset paper's pace: it states 17 min for "
        "total_timesteps=60,000 (58.8 a second), scaled to total_timesteps=1,000,000,000,000; that is over 30 "
        "days: pass --yes to run it anyway"
    )
    assert not started and not out.exists()
    assert main([*run, "-p", "total_timesteps", "120000", "-p", "lr", "0.5", "-p", "seed", "3"]) == 0
    assert capsys.readouterr().err.splitlines()[1] == (
        "rlq: estimated wall time 34 min at preset paper's pace: it states 17 min for total_timesteps=60,000 "
        "(58.8 a second), scaled to total_timesteps=120,000 (not accounting for the changed lr)"
    )
    assert main([*run, "-p", "total_timesteps", "1000000000000", "--yes"]) == 0
    assert "estimated wall time 539 years" in capsys.readouterr().err
    assert main(["run", "budget", "--preset", "quick", "--out", str(out)]) == 0
    assert capsys.readouterr().err.splitlines()[1] == "rlq: preset quick states a wall time of about 10 s"
    assert len(started) == 3
    assert main(["run", "tiny", "--out", str(out)]) == 0  # no preset: no wall time to tell
    assert len(capsys.readouterr().err.splitlines()) == 1
    assert [stated_seconds(t) for t in ("about 6.5 h (at 45 steps/s)", "47-50 min", "2.5 days", "none")] == [
        23400.0, 3000.0, 216000.0, None,
    ]  # fmt: skip
