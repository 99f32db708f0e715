"""A notebook's per-run function over its jobs: results saved under each job, loaded on resume, tables stacked."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from rlq.experiments.notebook_jobs import keys_label, run_line, run_notebook_jobs, stack_tables
from rlq.rl.parallel import JobsFailed, ResultStore

CALLS: list[dict] = []


def train_one(env_id: str, seed: int, method: str) -> dict:
    CALLS.append(dict(env_id=env_id, seed=seed, method=method))
    if method == "broken":
        raise RuntimeError("this method cannot train")
    keys = dict(env_id=env_id, seed=seed, method=method)
    row = {"avg_compression_ratio": 0.5, "final_train_return": float(seed), "wall_time_s": 1.0}
    table = pd.DataFrame({"step": [0, 10]}).assign(**keys)
    return {"keys": keys, "summary": {**keys, **row}, "history": table, "curve": table, "events": table}


def test_a_plain_job_is_its_own_key_and_other_jobs_keep_theirs():
    job = dict(env_id="Pendulum-v1", seed=0, method="gst")
    assert ResultStore.key(job, "job 1") == job
    assert ResultStore.key({"spec": object(), "keys": {"run": "a"}}, "job 1") == {"run": "a"}
    assert ResultStore.key({"spec": object()}, "job 1") == {"label": "job 1"}


def test_finished_runs_are_loaded_instead_of_trained_again(tmp_path):
    jobs = [dict(env_id="Pendulum-v1", seed=s, method="gst") for s in (0, 1)]
    CALLS.clear()
    lines = []
    first = run_notebook_jobs(train_one, jobs, tmp_path, progress=lines.append)
    assert len(CALLS) == 2 and lines[0].startswith(
        "env_id Pendulum-v1, seed 0, method gst: average compression"
    )
    again = run_notebook_jobs(train_one, [*jobs, dict(env_id="Pendulum-v1", seed=2, method="gst")], tmp_path)
    assert len(CALLS) == 3 and CALLS[-1]["seed"] == 2  # only the new seed trained
    assert [r["summary"] for r in again[:2]] == [r["summary"] for r in first]
    tables = stack_tables(again, tmp_path)
    assert list(tables["summary"]["seed"]) == [0, 1, 2]
    assert len(tables["history"]) == 6 and (tmp_path / "history.csv").is_file()


def test_a_failed_run_is_listed_and_raised_once_the_others_are_done(tmp_path):
    jobs = [
        dict(env_id="Pendulum-v1", seed=0, method="broken"),
        dict(env_id="Pendulum-v1", seed=0, method="gst"),
    ]
    with pytest.raises(JobsFailed, match="1 of 2 jobs failed"):
        run_notebook_jobs(train_one, jobs, tmp_path)
    failed = json.loads((tmp_path / "results.json").read_text())["failed_jobs"]
    assert failed[0]["label"] == "env_id Pendulum-v1, seed 0, method broken"
    assert len(list((tmp_path / "jobs").glob("*.json"))) == 1  # the run that finished is kept


def test_run_lines_name_the_run_and_its_numbers():
    assert keys_label({"seed": 0, "config": None, "method": "gst"}) == "seed 0, method gst"
    assert run_line("seed 0", {"something": 1}) == "seed 0: done"
    row = {
        "avg_compression_ratio": 0.25,
        "eval_return": -150.0,
        "final_train_return": -160.0,
        "wall_time_s": 3,
    }
    assert run_line("seed 0", {"summary": row}) == (
        "seed 0: average compression 0.250, evaluation return -150.00, last training episodes -160.00, 3 s"
    )
