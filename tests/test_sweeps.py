"""rlq sweep: one ordinary run per grid point in a sweep folder, summary and seed intervals, resume, bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import run_cli
from rlq.core.jsonio import read_json
from rlq.experiments.registry import ExperimentError, get_experiment
from rlq.experiments.run_folders import RESULTS_FILE
from rlq.experiments.sweeps import (
    SEEDS_FILE,
    SUMMARY_FILE,
    SWEEP_FILE,
    create_sweep,
    parse_grid,
    resume_sweep,
    split_values,
    sweep_points,
)


def test_values_split_at_top_level_commas_only():
    assert split_values("1, 2,3") == ["1", "2", "3"]
    assert split_values('[1, 2],[3],"a,b"') == ["[1, 2]", "[3]", '"a,b"']


@pytest.mark.slow
def test_a_sweep_runs_every_point_into_its_own_run_folder_with_a_summary(tiny_notebooks, tmp_path):
    path = create_sweep(
        "tiny", ["x=1,4", "sizes=[1],[1, 2, 3]"], preset="quick", overrides=[("scale", "2.0")], out=tmp_path
    )
    assert path.parent == tmp_path / "sweeps" / "tiny" and (path / SWEEP_FILE).is_file()
    assert not list(path.glob("tiny/*"))  # no run folder before the sweep runs
    sweep = resume_sweep(path)
    points = sweep["points"]
    assert [p["grid"] for p in points] == [
        {"x": 1, "sizes": [1]}, {"x": 1, "sizes": [1, 2, 3]}, {"x": 4, "sizes": [1]}, {"x": 4, "sizes": [1, 2, 3]},
    ]  # fmt: skip
    assert [p["status"] for p in points] == ["ok"] * 4 and sweep["fixed"] == {"scale": 2.0}
    runs = sorted(path.glob("tiny/*/results.json"))
    assert len(runs) == 4 and sorted(sweep_points(tmp_path)) == sorted(r.parent for r in runs)
    for point in points:
        params = json.loads((path / point["run"] / "params.json").read_text())
        assert params["x"] == point["grid"]["x"] and params["scale"] == 2.0
    summary = pd.read_csv(path / SUMMARY_FILE)
    assert summary["total"].tolist() == [2.0, 2.0, 8.0, 8.0] and summary["n_sizes"].tolist() == [1, 3, 1, 3]
    assert set(summary["status"]) == {"ok"} and not (path / SEEDS_FILE).exists()
    saved = json.loads((path / SWEEP_FILE).read_text())
    assert saved["grid"] == {"x": [1, 4], "sizes": [[1], [1, 2, 3]]} and saved["preset"] == "quick"
    from rlq.faces.report import collect_runs

    records = collect_runs(tmp_path, results_dir=tmp_path / "no_results")  # rlq report sees the points
    assert sorted(r.path for r in records) == sorted(r.parent for r in runs)
    assert {(r.experiment, r.preset, r.status) for r in records} == {("tiny", "quick", "ok")}


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_only_the_points_without_a_finished_run(tiny_notebooks, tmp_path):
    path = create_sweep("tiny", ["x=1,2,3,4"], out=tmp_path)

    def stop_after_two(point):
        if sum(p["status"] == "ok" for p in json.loads((path / SWEEP_FILE).read_text())["points"]) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        resume_sweep(path, on_point=stop_after_two)
    sweep = json.loads((path / SWEEP_FILE).read_text())
    assert [p["status"] for p in sweep["points"]] == ["ok", "ok", "pending", "pending"]
    finished = {
        p["run"]: json.loads((path / p["run"] / "results.json").read_text()) for p in sweep["points"][:2]
    }
    ran = []
    sweep = resume_sweep(path, on_point=ran.append)
    assert [p["index"] for p in ran] == [2, 3] and all(p["status"] == "ok" for p in sweep["points"])
    for run, results in finished.items():  # the finished points were not run again
        assert json.loads((path / run / "results.json").read_text())["started"] == results["started"]
    assert pd.read_csv(path / SUMMARY_FILE)["total"].tolist() == [0.5, 1.0, 1.5, 2.0]


@pytest.mark.slow
def test_a_failed_point_does_not_stop_the_others_and_is_run_again_on_resume(tiny_notebooks, tmp_path):
    path = create_sweep("tiny", ["fail=true,false"], out=tmp_path)
    sweep = resume_sweep(path, max_parallel=2)
    assert [p["status"] for p in sweep["points"]] == ["failed", "ok"]
    assert pd.read_csv(path / SUMMARY_FILE)["status"].tolist() == ["failed", "ok"]
    failed_run = path / sweep["points"][0]["run"]
    ran = []
    resume_sweep(path, on_point=ran.append)  # still failing (the notebook asks to), but only it ran again
    assert [p["index"] for p in ran] == [0] and (failed_run / "attempts" / "1").is_dir()


@pytest.mark.slow
def test_seed_in_the_grid_adds_intervals_over_seeds(tiny_notebooks, tmp_path, monkeypatch):
    from conftest import write_tiny_notebook

    nb = write_tiny_notebook(tiny_notebooks, "seeded")
    text = nb.read_text().replace("x = 1  # an int", "x = 1  # an int\\nseed = 0  # a seed [min: 0]")
    text = text.replace("rlq.record(total=x * scale", "rlq.record(total=x * scale + seed")
    nb.write_text(text)
    path = create_sweep("seeded", ["x=1,3", "seed=0,2"], out=tmp_path)
    resume_sweep(path, max_parallel=2)
    seeds = pd.read_csv(path / SEEDS_FILE)
    total = seeds[seeds["metric"] == "total"].set_index("x")
    assert total["n"].tolist() == [2, 2] and total.loc[1, "mean"] == pytest.approx(1.5)
    assert total.loc[3, "mean"] == pytest.approx(2.5) and total.loc[3, "std"] == pytest.approx(2**0.5)
    assert (total["lower"] <= total["iqm"]).all() and (total["iqm"] <= total["upper"]).all()


@pytest.mark.parametrize(
    "grid, message",
    [
        ([], "at least one --grid"),
        (["x="], "no values"),
        (["x"], "expected KEY=V1,V2"),
        (["nope=1,2"], "no parameter 'nope'"),
        (["x=1,two"], "expects int"),
        (["x=1,1"], "repeated"),
        (["x=1", "x=2"], "more than once"),
        (["x=-1,2"], None),  # accepted: the tiny notebook's x has no constraint
    ],
)
def test_bad_grids_are_refused_before_any_folder(tiny_notebooks, tmp_path, grid, message):
    experiment = get_experiment("tiny")
    if message is None:
        assert list(parse_grid(experiment, grid)) == ["x"]
        return
    with pytest.raises(ExperimentError, match=message):
        create_sweep("tiny", grid, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["nope", "--grid", "x=1,2"], "unknown experiment"),
        (["tiny", "--grid", "nope=1,2"], "no parameter 'nope'"),
        (["tiny", "--grid", "x=1,two"], "expects int"),
        (["tiny", "--grid", "x="], "no values"),
        (["tiny"], "at least one --grid"),
        (["tiny", "--grid", "x=1", "-p", "x", "2"], "both with -p and --grid"),
        (["tiny", "--grid", "x=1", "--preset", "huge"], "no preset 'huge'"),
        (["tiny", "--grid", "x=1", "--max-parallel", "0"], "--max-parallel"),
    ],
)
def test_rlq_sweep_bad_input_exits_2_with_no_folder(tiny_notebooks, tmp_path, args, message):
    out = tmp_path / "out"
    done = run_cli("sweep", *args, "--out", str(out), env={"RLQ_NOTEBOOKS": str(tiny_notebooks)})
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and not out.exists()


@pytest.mark.slow
def test_rlq_sweep_runs_and_resumes_from_the_command_line(tiny_notebooks, tmp_path):
    out = tmp_path / "out"
    env = {"RLQ_NOTEBOOKS": str(tiny_notebooks)}
    done = run_cli(
        "sweep", "tiny", "--preset", "quick", "--grid", "scale=1.0,3.0", "--out", str(out), env=env
    )
    assert done.returncode == 0, done.stderr
    path = type(out)(done.stdout.strip().splitlines()[-1])
    assert path.parent == out / "sweeps" / "tiny" and "2 of 2 points ok" in done.stderr
    assert pd.read_csv(path / SUMMARY_FILE)["total"].tolist() == [2.0, 6.0]
    again = run_cli("sweep", "--resume", str(path), env=env)
    assert again.returncode == 0 and "2 of 2 points ok" in again.stderr
    assert run_cli("sweep", "--resume", str(path), "tiny", env=env).returncode == 2


@pytest.mark.slow
def test_a_sweep_on_ray_writes_every_point_and_leaves_no_ray_behind(tiny_notebooks, tmp_path, monkeypatch):
    """The one Ray test here: a local Ray of 2 CPUs started by the sweep, shut down at its end."""
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    monkeypatch.chdir(tmp_path)
    path = create_sweep("tiny", ["x=1,2", "scale=1.0,2.0"], out=tmp_path / "out")
    sweep = resume_sweep(path, executor="ray", max_parallel=2)
    errors = [read_json(path / p["run"] / RESULTS_FILE).get("error") for p in sweep["points"]]
    assert [p["status"] for p in sweep["points"]] == ["ok"] * 4, errors
    assert not ray.is_initialized()
    assert len(list(path.glob("tiny/*/results.json"))) == 4
    assert pd.read_csv(path / SUMMARY_FILE)["total"].tolist() == [1.0, 2.0, 2.0, 4.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "notebooks",
        "out",
    ]  # no Ray folder in the working dir


def test_a_grid_above_the_limit_is_refused_naming_its_size_before_any_folder(tiny_notebooks, tmp_path):
    from rlq.experiments.sweeps import MAX_POINTS

    values = ",".join(str(i) for i in range(MAX_POINTS + 1))
    with pytest.raises(ExperimentError, match=f"{MAX_POINTS + 1} points .* more than a sweep's {MAX_POINTS}"):
        create_sweep("tiny", [f"x={values}"], out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_sweep_whose_point_folders_were_deleted_runs_them_again(tiny_notebooks, tmp_path):
    import shutil

    path = create_sweep("tiny", ["x=1,2"], out=tmp_path)
    sweep = resume_sweep(path)
    shutil.rmtree(path / sweep["points"][0]["run"])
    saved = json.loads((path / SWEEP_FILE).read_text())
    del saved["points"][1]["run"]  # a hand-edited sweep.json without the key
    (path / SWEEP_FILE).write_text(json.dumps(saved))
    sweep = resume_sweep(path)
    assert [p["status"] for p in sweep["points"]] == ["ok", "ok"]
    assert all((path / p["run"] / "results.json").is_file() for p in sweep["points"])
    assert pd.read_csv(path / SUMMARY_FILE)["total"].tolist() == [0.5, 1.0]
