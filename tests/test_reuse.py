"""Reusing finished runs in a new run folder (``rlq run --reuse``): rebuilt exactly, loaded not retrained, checked."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from rlq.core.jsonio import read_json, write_json
from rlq.experiments.notebook_jobs import RUN_TABLES, _stack
from rlq.experiments.results import committed_dir, publish
from rlq.experiments.reuse import parse_run_spec, plan_reuse, published_runs, save_reuse
from rlq.experiments.runner import run_experiment
from rlq.faces.cli import main

LONG = committed_dir("gst_td3_mujoco", "long")


def test_published_runs_rebuild_every_table_of_the_published_run():
    runs = published_runs(LONG)
    summary = pd.read_csv(LONG / "summary.csv")
    assert [key for key, _ in runs] == summary[["env_id", "seed", "method"]].to_dict("records")
    for key, _ in runs:
        assert type(key["seed"]) is int  # as the job names it, so the job store finds it
    for name in RUN_TABLES:
        published = pd.read_csv(LONG / f"{name}.csv", float_precision="round_trip")
        if name == "summary":
            rebuilt = pd.DataFrame([result["summary"] for _, result in runs])
        else:
            rebuilt = _stack([result[name] for _, result in runs])
            assert sum(len(result[name]) for _, result in runs) == len(published)
        pd.testing.assert_frame_equal(
            rebuilt[published.columns], published, check_dtype=False, check_exact=True
        )


def _params(**changes):
    from rlq.experiments.registry import get_experiment

    params = get_experiment("gst_td3_mujoco").resolve("long", [("seeds", "[0, 1, 2, 3, 4]")])
    return {**params, **changes}


def test_plan_reuse_takes_only_the_runs_this_run_trains():
    ((source, _, runs),) = plan_reuse([LONG], "gst_td3_mujoco", _params(seeds=[1, 7], methods=["gst"]))
    assert source == LONG
    assert [key for key, _ in runs] == [{"env_id": "HalfCheetah-v5", "seed": 1, "method": "gst"}]


def test_retrain_leaves_the_named_runs_out_of_every_source():
    summary = pd.read_csv(LONG / "summary.csv")
    expected = [
        key for key in summary[["env_id", "seed", "method"]].to_dict("records")
        if not (key["method"] == "gst" and key["seed"] in (1, 3))
    ]  # fmt: skip
    ((_, _, runs),) = plan_reuse(
        [LONG], "gst_td3_mujoco", _params(), ["method=gst,seed=1", "seed=3,method=gst"]
    )
    assert [key for key, _ in runs] == expected
    assert len(runs) == len(summary) - 2
    ((_, _, runs),) = plan_reuse([LONG], "gst_td3_mujoco", _params(), ["method=dense"])
    assert {key["method"] for key, _ in runs} == {"gst"}


def test_parse_run_spec_reads_fields_and_refuses_what_is_not_a_run():
    assert parse_run_spec("method=gst, seed=2") == {"method": "gst", "seed": 2}
    assert parse_run_spec("env_id=HalfCheetah-v5") == {"env_id": "HalfCheetah-v5"}
    for bad, message in [("gst", "FIELD=VALUE"), ("seed=", "FIELD=VALUE"), ("seed=1,seed=2", "given twice")]:
        with pytest.raises(ValueError, match=message):
            parse_run_spec(bad)


def test_retrain_refuses_a_spec_that_names_no_run_and_one_that_empties_a_source():
    with pytest.raises(ValueError, match="--retrain method=gst,seed=9: no run"):
        plan_reuse([LONG], "gst_td3_mujoco", _params(), ["method=gst,seed=9"])
    with pytest.raises(
        ValueError, match="--retrain method=gst,seed=4: no run"
    ):  # a seed this run does not train
        plan_reuse([LONG], "gst_td3_mujoco", _params(seeds=[0, 1]), ["method=gst,seed=4"])
    with pytest.raises(ValueError, match="no run"):  # a field no run has
        plan_reuse([LONG], "gst_td3_mujoco", _params(), ["algo=td3"])
    with pytest.raises(ValueError, match="names every run it holds"):
        plan_reuse([LONG], "gst_td3_mujoco", _params(methods=["gst"]), ["method=gst"])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"total_timesteps": 1000}, "total_timesteps 150000 (this run: 1000)"),
        ({"max_sparsity": 0.8}, "max_sparsity 0.9 (this run: 0.8)"),
        ({"eval_episodes": 5}, "eval_episodes 10 (this run: 5)"),
        ({"seeds": [7]}, "holds none of this run's"),
    ],
)
def test_plan_reuse_refuses_runs_trained_otherwise(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_reuse([LONG], "gst_td3_mujoco", _params(**changes))


def test_plan_reuse_refuses_another_experiment_an_unfinished_run_and_a_run_given_twice(tmp_path):
    with pytest.raises(ValueError, match="not of 'gst_sweep'"):
        plan_reuse([LONG], "gst_sweep", _params())
    with pytest.raises(ValueError, match="also in"):
        plan_reuse([LONG, LONG], "gst_td3_mujoco", _params())
    unfinished = tmp_path / "unfinished"
    shutil.copytree(LONG, unfinished)
    write_json(unfinished / "results.json", {**read_json(LONG / "results.json"), "status": "failed"})
    with pytest.raises(ValueError, match="did not finish"):
        plan_reuse([unfinished], "gst_td3_mujoco", _params())
    with pytest.raises(ValueError, match="not a run folder"):
        plan_reuse([tmp_path], "gst_td3_mujoco", _params())


@pytest.mark.slow
def test_a_run_with_more_seeds_loads_the_reused_runs_instead_of_training_them(tmp_path):
    small = [("methods", '["dense", "gst"]'), ("total_timesteps", "400")]
    first = run_experiment("gst_td3_mujoco", "quick", small, tmp_path / "runs", progress=False)
    assert first.ok, first.results.get("error")
    published = publish(first.path, dest=tmp_path / "published")
    assert main([
        "run", "gst_td3_mujoco", "--preset", "quick", "-p", "methods", '["dense", "gst"]', "-p", "total_timesteps",
        "500", "--reuse", str(published), "--out", str(tmp_path / "refused"), "--quiet",
    ]) == 2  # fmt: skip
    assert not (tmp_path / "refused").exists()  # refused before any folder was made
    more = run_experiment(
        "gst_td3_mujoco", "quick", [*small, ("seeds", "[0, 1]")], tmp_path / "runs", progress=False,
        reuse=[published],
    )  # fmt: skip
    assert more.ok, more.results.get("error")
    assert [entry["runs"] for entry in more.results["reused"]] == [2]
    before, after = (pd.read_csv(path / "summary.csv") for path in (first.path, more.path))
    assert sorted(after["seed"]) == [0, 0, 1, 1]
    # the seed-0 rows are the first run's to the last digit of its wall time: loaded, not trained again
    pd.testing.assert_frame_equal(after[after["seed"] == 0].reset_index(drop=True), before, check_dtype=False)
    assert not (more.path / "runs" / "Pendulum-v1__gst__0").exists()
    assert (more.path / "runs" / "Pendulum-v1__gst__1").exists()
    # --retrain: the named run trains again, the others are loaded; refused without --reuse
    assert main([
        "run", "gst_td3_mujoco", "--preset", "quick", "--retrain", "method=gst,seed=0", "--out",
        str(tmp_path / "refused"), "--quiet",
    ]) == 2  # fmt: skip
    assert not (tmp_path / "refused").exists()
    again = run_experiment(
        "gst_td3_mujoco", "quick", small, tmp_path / "runs", progress=False, reuse=[published],
        retrain=["method=gst,seed=0"],
    )  # fmt: skip
    assert again.ok, again.results.get("error")
    (replaced,) = again.results["retrained"]  # what the merge replaced, with the replaced run's numbers
    assert replaced["run"] == "method=gst,seed=0" and replaced["source"] == str(published)
    assert replaced["key"] == {"env_id": "Pendulum-v1", "seed": 0, "method": "gst"}
    old = pd.read_csv(published / "summary.csv").query("method == 'gst' and seed == 0").iloc[0]
    assert replaced["replaced"]["avg_compression_ratio"] == old["avg_compression_ratio"]
    assert (
        replaced["replaced"]["eval_return"] == old["eval_return"]
        and "wall_time_s" not in replaced["replaced"]
    )
    assert [entry["keys"] for entry in again.results["reused"]] == [
        [{"env_id": "Pendulum-v1", "seed": 0, "method": "dense"}]
    ]
    retrained = pd.read_csv(again.path / "summary.csv").set_index("method")
    assert retrained.loc["dense", "wall_time_s"] == before.set_index("method").loc["dense", "wall_time_s"]
    assert retrained.loc["gst", "wall_time_s"] != before.set_index("method").loc["gst", "wall_time_s"]
    assert (again.path / "runs" / "Pendulum-v1__gst__0").exists()
    assert not (again.path / "runs" / "Pendulum-v1__dense__0").exists()


def test_settings_name_functions_and_objects_alike_in_every_process():
    import torch

    from rlq.core.jsonio import plain_json

    class Noise:
        pass

    settings = {"activation_fn": torch.nn.ReLU, "schedule": plain_json, "noise": Noise(), "arch": (64, 64)}
    shown = plain_json(settings)
    assert shown["activation_fn"] == "torch.nn.modules.activation.ReLU" and shown["arch"] == [64, 64]
    assert shown["schedule"] == "rlq.core.jsonio.plain_json" and "0x" not in shown["noise"]
    assert plain_json({**settings, "noise": Noise()}) == shown  # another object of the same kind: equal


def test_publish_carries_a_runs_actors_and_reuse_copies_them_without_replacing_any(tmp_path, monkeypatch):
    import rlq.experiments.results as results

    run = tmp_path / "run"
    shutil.copytree(LONG, run)
    (run / "actors").mkdir()
    (run / "actors" / "gst__0.npz").write_bytes(b"actor bytes")
    published = publish(run, dest=tmp_path / "published")
    assert (published / "actors" / "gst__0.npz").read_bytes() == b"actor bytes"
    plan = plan_reuse([published], "gst_td3_mujoco", _params())
    new = tmp_path / "new"
    reused = save_reuse(plan, new)
    assert (new / "actors" / "gst__0.npz").read_bytes() == b"actor bytes"
    assert reused[0]["runs"] == len(list((new / "jobs").iterdir())) == len(pd.read_csv(LONG / "summary.csv"))
    held = tmp_path / "held"
    (held / "actors").mkdir(parents=True)
    (held / "actors" / "gst__0.npz").write_bytes(b"another actor")
    with pytest.raises(FileExistsError, match="gst__0.npz is already in the run folder"):
        save_reuse(plan, held)
    assert (held / "actors" / "gst__0.npz").read_bytes() == b"another actor" and not (held / "jobs").exists()
    monkeypatch.setattr(results, "RUN_FILES_MAX_BYTES", 10)
    with pytest.raises(ValueError, match="save each actor alone"):
        publish(run, dest=tmp_path / "too_big")
    assert not (tmp_path / "too_big").exists()
