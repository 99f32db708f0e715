"""Run folders: unique names, never overwritten; record() merges plain JSON numbers."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from rlq.experiments.run_folders import RUN_DIR_ENV, list_runs, load_run, new_run_dir, record, run_dir


def test_new_run_dir_never_reuses_an_existing_folder(tmp_path):
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    first = new_run_dir(tmp_path, "exp", now=now, run_id="abc123")
    assert first == tmp_path / "exp" / "20260102T030405Z-abc123"
    (first / "results.json").write_text('{"status": "ok", "keep": 1}')
    with pytest.raises(FileExistsError):
        new_run_dir(tmp_path, "exp", now=now, run_id="abc123")
    assert json.loads((first / "results.json").read_text())["keep"] == 1
    assert new_run_dir(tmp_path, "exp", now=now) != first  # random ids differ


def test_record_merges_into_results_and_converts_numpy(tmp_path, monkeypatch):
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    record(a=np.float32(1.5), n=np.int64(3))
    record(b=[np.float64(0.25), 2], a=2.0, nan=float("nan"))
    data = json.loads((tmp_path / "results.json").read_text())
    assert data == {"a": 2.0, "n": 3, "b": [0.25, 2], "nan": None}


def test_record_shows_three_significant_figures_and_keeps_every_digit(tmp_path, monkeypatch):
    from IPython.lib.pretty import pretty

    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    numbers = {"rate": 3071.2173576734226, "nested": {"share": [0.00027264739791135333, -1e-12]}, "n": 3}
    shown = record(**numbers)
    assert shown == numbers  # the values themselves are exact
    assert json.loads((tmp_path / "results.json").read_text()) == numbers
    assert pretty(shown) == "{'rate': 3070.0, 'nested': {'share': [0.000273, -1e-12]}, 'n': 3}"
    assert pretty(record(drop=-0.0004, zero=-0.0)) == "{'drop': -0.0004, 'zero': 0.0}"


@pytest.mark.parametrize("bad", [{"status": "ok"}, {"error": "x"}, {"arr": object()}])
def test_record_rejects_reserved_keys_and_non_numbers(tmp_path, monkeypatch, bad):
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    with pytest.raises((ValueError, TypeError)):
        record(**bad)
    assert not (tmp_path / "results.json").exists()


def test_interactive_run_dir_is_created_once_per_process(tmp_path, monkeypatch):
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    monkeypatch.setenv("RLQ_RUNS", str(tmp_path))
    first = run_dir()
    assert first.parent == (tmp_path / "interactive").resolve()
    assert run_dir() == first
    record(x=1)
    assert load_run(first) == {"path": first, "params": {}, "results": {"x": 1}}  # no notebook: no parameters
    assert (first / "params.json").is_file()
    assert list_runs(tmp_path) == [first]


def test_publish_copies_csvs_and_refuses_to_overwrite(tmp_path):
    from rlq.experiments.results import publish

    run = new_run_dir(tmp_path / "runs", "exp")
    (run / "params.json").write_text('{"x": 1}')
    (run / "results.json").write_text('{"status": "failed", "experiment": "exp", "preset": "medium"}')
    (run / "table.csv").write_text("a,b\n1,2\n")
    dest = tmp_path / "data" / "exp" / "medium"
    with pytest.raises(ValueError, match="only finished runs"):
        publish(run, dest=dest)
    (run / "results.json").write_text('{"status": "ok", "experiment": "exp", "preset": "medium", "y": 3}')
    assert publish(run, dest=dest) == dest
    assert (dest / "table.csv").read_text() == "a,b\n1,2\n"
    assert json.loads((dest / "results.json").read_text())["run_folder"] == run.name
    with pytest.raises(FileExistsError):
        publish(run, dest=dest)
    (run / "table.csv").write_text("a,b\n5,6\n")
    publish(run, dest=dest, overwrite=True)
    assert (dest / "table.csv").read_text() == "a,b\n5,6\n"


def test_publish_into_data_results_accepts_only_the_registrys_names(tmp_path):
    from rlq.experiments.registry import ExperimentError
    from rlq.experiments.results import publish

    run = new_run_dir(tmp_path / "runs", "exp")
    (run / "params.json").write_text("{}")
    for experiment, preset, error, message in [
        ("../../../../escaped_publish", "medium", ExperimentError, "escaped_publish"),
        ("gst_td3_mujoco", "../medium", ValueError, "not one of gst_td3_mujoco's presets"),
    ]:
        (run / "results.json").write_text(
            json.dumps({"status": "ok", "experiment": experiment, "preset": preset})
        )
        with pytest.raises(error, match=message):
            publish(run)
    assert not (tmp_path / "escaped_publish").exists()
    (run / "results.json").write_text('{"status": "running", "experiment": "exp", "preset": "medium"}')
    with pytest.raises(ValueError, match="the run is interrupted"):  # its runner is gone: not "running"
        publish(run, dest=tmp_path / "d")


def test_a_run_id_that_is_taken_is_drawn_again(tmp_path, monkeypatch):
    import secrets
    from datetime import datetime, timezone

    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    draws = iter(["aaaaaa", "aaaaaa", "bbbbbb"])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(draws))
    first = new_run_dir(tmp_path, "exp", now=now)
    second = new_run_dir(tmp_path, "exp", now=now)  # the same second, the same first draw
    assert first.name.endswith("-aaaaaa") and second.name.endswith("-bbbbbb") and second.is_dir()
    with pytest.raises(FileExistsError):
        new_run_dir(tmp_path, "exp", now=now, run_id="aaaaaa")


def _published_run(tmp_path, experiment: str, preset: str, **changes):
    from rlq.experiments.registry import get_experiment

    run = new_run_dir(tmp_path / "runs", experiment)
    params = {**get_experiment(experiment).resolve(preset), **changes}
    (run / "params.json").write_text(json.dumps(params))
    (run / "results.json").write_text(
        json.dumps({"status": "ok", "experiment": experiment, "preset": preset})
    )
    (run / "summary.csv").write_text("a\n1\n")
    return run


def test_publish_refuses_a_variant_under_its_presets_name_and_takes_it_under_its_own(tmp_path, monkeypatch):
    import rlq.experiments.results as results

    monkeypatch.setattr(results, "data_dir", lambda: tmp_path / "data")
    variant = _published_run(tmp_path, "gst_td3_mujoco", "medium", total_timesteps=1000, seeds=[0])
    with pytest.raises(
        ValueError, match=r"variant of gst_td3_mujoco's medium preset \(it changes total_timesteps\)"
    ):
        results.publish(variant)
    with pytest.raises(ValueError, match=r"variant of .* --as medium_total_timesteps"):
        results.publish(variant, overwrite=True)  # --overwrite does not make a variant the preset's result
    assert not (tmp_path / "data").exists()
    with pytest.raises(ValueError, match="another preset of gst_td3_mujoco"):
        results.publish(variant, name="ablation")
    with pytest.raises(ValueError, match="lower-case letters"):
        results.publish(variant, name="../elsewhere")
    target = results.publish(variant, name="medium_short")
    assert target == tmp_path / "data" / "results" / "gst_td3_mujoco" / "medium_short"
    assert (target / "summary.csv").read_text() == "a\n1\n"
    # a run evaluated on fewer episodes measures something else: it cannot stand for the preset either
    one_episode = _published_run(tmp_path, "gst_td3_mujoco", "medium", eval_episodes=1)
    with pytest.raises(ValueError, match=r"\(it changes eval_episodes\)"):
        results.publish(one_episode)
    # seeds and how a run runs do not make a variant: the preset's own run publishes under its name
    plumbing = dict(workers=7, executor="ray", ray_address="auto", torch_threads=3, checkpoint_every=11)
    same = _published_run(
        tmp_path, "gst_td3_mujoco", "medium", seeds=[0, 1, 2], show_committed=False, **plumbing
    )
    assert results.publish(same).name == "medium"


def test_publish_replaces_the_folder_as_a_whole(tmp_path, monkeypatch):
    import rlq.experiments.results as results

    monkeypatch.setattr(results, "data_dir", lambda: tmp_path / "data")
    run = _published_run(tmp_path, "gst_td3_mujoco", "medium")
    (run / "history.csv").write_text("b\n2\n")
    target = results.publish(run)
    (target / "figure.png").write_bytes(b"stale")
    (run / "history.csv").unlink()
    (run / "summary.csv").write_text("a\n9\n")
    assert results.publish(run, overwrite=True) == target
    assert sorted(p.name for p in target.iterdir()) == ["params.json", "results.json", "summary.csv"]
    assert (target / "summary.csv").read_text() == "a\n9\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["medium"]  # no staging folder left behind


class Killed(BaseException):
    """A kill at one step of a publish: nothing in publish catches it, so the files stay as a kill leaves them."""


def _folder(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())} if path.is_dir() else None


@pytest.mark.parametrize("swap", ["exchange", "move aside"])
def test_a_publish_killed_at_any_step_loses_no_committed_file_and_the_next_publish_recovers(
    tmp_path, monkeypatch, caplog, swap
):
    """Each file operation of `publish --overwrite` (copies, writes, renames, deletions) is killed in turn; the
    published folder then holds the old files or the new ones, and a plain publish after it puts a moved-aside
    copy back and refuses to replace it. Where the file system cannot swap two folders in one step (``move
    aside``), the old folder is moved aside first."""
    import os
    import shutil

    import rlq.experiments.results as results

    monkeypatch.setattr(results, "data_dir", lambda: tmp_path / "data")
    old_run = _published_run(tmp_path, "gst_td3_mujoco", "medium")
    new_run = _published_run(tmp_path, "gst_td3_mujoco", "medium")
    (new_run / "summary.csv").write_text("a\n2\n")
    (new_run / "history.csv").write_text("b\n3\n")
    target = tmp_path / "data" / "results" / "gst_td3_mujoco" / "medium"
    if swap == "move aside":
        monkeypatch.setattr(results, "_exchange", lambda a, b: False)
    steps, kill_at = [], [None]

    def counted(name, func):
        def step(*args, **kwargs):
            if len(steps) == kill_at[0]:
                raise Killed(name)
            steps.append(name)
            return func(*args, **kwargs)

        return step

    for module, name in [(os, "rename"), (shutil, "rmtree"), (shutil, "copy2"), (results, "write_json")]:
        monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    monkeypatch.setattr(results, "_exchange", counted("exchange", results._exchange))

    results.publish(old_run)
    committed = _folder(target)
    steps.clear()
    results.publish(new_run, overwrite=True)
    published, swap_steps = _folder(target), list(steps)
    assert committed["summary.csv"] == b"a\n1\n" and published["summary.csv"] == b"a\n2\n"
    assert swap_steps.count("rename") == (0 if swap == "exchange" else 2) and "exchange" in swap_steps
    for k in range(len(swap_steps)):
        shutil.rmtree(target.parent)
        kill_at[0] = None
        results.publish(old_run)
        steps.clear()
        kill_at[0] = k
        with pytest.raises(Killed):
            results.publish(new_run, overwrite=True)
        kill_at[0] = None
        aside = target.with_name(".medium.replaced")
        assert _folder(target) in (committed, published) or (
            _folder(target) is None and _folder(aside) == committed
        ), f"killed at step {k} ({swap_steps[k]})"
        caplog.clear()
        with pytest.raises(FileExistsError, match="already holds published results"):
            results.publish(old_run)  # a plain publish: puts the old folder back and replaces nothing
        assert _folder(target) in (committed, published), f"killed at step {k} ({swap_steps[k]})"
        assert [p.name for p in target.parent.iterdir()] == ["medium"], f"killed at step {k}"
        if "put back" in caplog.text:
            assert _folder(target) == committed and str(target) in caplog.text


@pytest.mark.slow
def test_a_jupyterlab_run_folder_holds_its_parameters_and_the_cli_lists_and_resumes_it(
    tiny_notebooks, tmp_path
):
    """An IPython process stands for the JupyterLab kernel: JupyterLab names the notebook in
    ``JPY_SESSION_NAME``, the parameters cell's values are in the namespace, and the process ends (is
    interrupted) before the notebook's record cell."""
    import os
    import subprocess
    import sys

    from conftest import run_cli

    runs = tmp_path / "runs"
    env = {**os.environ, "JPY_SESSION_NAME": str(tiny_notebooks / "tiny.ipynb"), "RLQ_RUNS": str(runs)}
    env.pop(RUN_DIR_ENV, None)
    cell = "x = 4\nscale = 0.5\nlabel = 'b'\nflag = False\nsizes = [1, 2, 3]\nfail = False\n"
    code = cell + "from rlq.experiments.run_folders import run_dir\nprint(run_dir())\n"
    kernel = subprocess.run(
        [sys.executable, "-m", "IPython", "--quick", "--no-banner", "-c", code],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert kernel.returncode == 0, kernel.stderr
    (folder,) = (runs / "interactive").iterdir()
    assert str(folder) in kernel.stdout
    params = {"x": 4, "scale": 0.5, "label": "b", "flag": False, "sizes": [1, 2, 3], "fail": False}
    assert json.loads((folder / "params.json").read_text()) == params
    assert json.loads((folder / "results.json").read_text())["experiment"] == "tiny"
    listing = run_cli("runs", "--runs", str(runs))
    assert listing.stdout.split("  ")[:2] == [str(folder), "interrupted"], listing.stdout
    resumed = run_cli("run", "--resume", str(folder), "--quiet")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    results = json.loads((folder / "results.json").read_text())
    assert results["status"] == "ok" and results["total"] == 2.0 and results["n_sizes"] == 3


def test_a_changed_parameter_trains_in_a_new_interactive_run_folder(tmp_path, monkeypatch):
    """In JupyterLab: Run All after changing a knob makes a new folder; only the training cell again refuses."""
    from rlq.experiments import run_folders
    from rlq.experiments.notebook_jobs import run_notebook_jobs

    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    monkeypatch.delenv(run_folders.INTERACTIVE_ENV, raising=False)
    monkeypatch.setenv("RLQ_RUNS", str(tmp_path))
    namespace = {"s_shift": 0.25, "seeds": [0], "workers": 1}
    notebook = (namespace, Path("gst_td3_mujoco.ipynb"))
    monkeypatch.setattr(run_folders, "_kernel_notebook", lambda: notebook)
    try:
        first = run_dir()
        assert json.loads((first / "params.json").read_text()) == namespace
        namespace["workers"] = 2  # how it runs: the same folder
        assert run_dir() == first
        namespace["s_shift"] = 0.5
        with pytest.raises(
            run_folders.ParametersChanged, match=r"^Run All .*: s_shift 0.25 -> 0.5 since"
        ) as err:
            run_notebook_jobs(print, [{"seed": 0}], first)
        assert err.value._render_traceback_() == [f"ParametersChanged: {err.value}"]  # IPython: one line
        second = run_dir()  # the cell that makes the folder, run again
        assert second != first and json.loads((second / "params.json").read_text())["s_shift"] == 0.5
        assert run_notebook_jobs(lambda seed: seed + 1, [{"seed": 0}], second) == [1]
    finally:
        for heartbeat in list(run_folders._KERNEL_HEARTBEAT):
            heartbeat.stop()
            run_folders._KERNEL_HEARTBEAT.remove(heartbeat)
