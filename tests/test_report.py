"""rlq report on synthetic run folders: claims filled from the best finished run, failed runs listed."""

from __future__ import annotations

import json

import pytest

from rlq.experiments.paper import paper_numbers
from rlq.experiments.runs import new_run_dir
from rlq.faces.cli import main
from rlq.faces.report import build_report, claims_table, collect_runs


def _run(parent, experiment, preset, status, results, params=None, finished="20261130T000000Z"):
    path = new_run_dir(parent, experiment)
    (path / "params.json").write_text(json.dumps(params or {"seed": 0}))
    body = {"status": status, "experiment": experiment, "preset": preset, "finished": finished, **results}
    (path / "results.json").write_text(json.dumps(body))
    return path


@pytest.fixture
def runs(tmp_path):
    parent = tmp_path / "runs"
    _run(
        parent,
        "quarl_ptq",
        "quick",
        "ok",
        {"worst_int8_relative_change": -0.5, "lowest_bits_within_tolerance": {"a": 12}},
    )
    _run(
        parent,
        "quarl_ptq",
        "medium",
        "ok",
        {"worst_int8_relative_change": -0.02, "lowest_bits_within_tolerance": {"a": 6, "b": 7}},
        params={"seeds": [0, 1]},
    )
    _run(parent, "gst_classification", "medium", "failed", {"error": "RuntimeError: boom"})
    return parent


def test_claims_come_from_the_largest_finished_preset(runs, tmp_path):
    table = claims_table(collect_runs(runs, tmp_path / "no_results"))
    drop = table[(table.paper == "quarl") & (table.metric == "int8_reward_drop")].iloc[0]
    assert drop.ours == pytest.approx(2.0) and drop.preset == "medium" and drop.seeds == "[0, 1]"
    assert drop.holds == "yes"  # a 2% drop is within the 5% tolerance
    bits = table[(table.paper == "quarl") & (table.metric == "enough_bits_max")].iloc[0]
    assert bits.ours == 7 and bits.paper_value == 8 and bits.holds == "yes"
    cifar = table[(table.experiment == "cifar10") & (table.metric == "compression_ratio")].iloc[0]
    assert cifar.holds == "no finished run"  # the only run failed
    assert (table.holds == "not measured").sum() > 0  # numbers no experiment measures yet are listed too
    assert len(table) == len(paper_numbers())


def test_report_html_lists_failed_runs_and_the_cli_prints_its_path(runs, tmp_path, capsys):
    out, text = build_report(runs, tmp_path / "report.html", tmp_path / "no_results")
    page = out.read_text()
    assert "RuntimeError: boom" in page and ">failed<" in page
    assert "int8_reward_drop" in page and "plotly" in page.lower()
    assert "2 measured by rlq, 2 hold (0 of them in another setting)" in text and "3 runs (1 failed)" in text
    assert main(["report", "--runs", str(runs), "--out", str(tmp_path / "r2.html")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(tmp_path / "r2.html")


def test_a_claim_measured_in_another_setting_says_so(tmp_path):
    parent = tmp_path / "runs"
    _run(
        parent,
        "gst_classification",
        "medium",
        "ok",
        {"dataset": "digits", "gst_final_compression": 69.8, "gst_accuracy_drop_vs_dense": 0.56},
    )
    table = claims_table(collect_runs(parent, tmp_path / "no_results"))
    row = table[(table.experiment == "cifar10") & (table.metric == "compression_ratio")].iloc[0]
    assert row.ours == pytest.approx(69.8) and row.holds == "yes (measured on digits, not CIFAR-10)"
    _, text = build_report(parent, tmp_path / "r.html", tmp_path / "no_results")
    assert "2 measured by rlq, 2 hold (2 of them in another setting)" in text


def test_a_finished_run_without_the_number_says_so(tmp_path):
    parent = tmp_path / "runs"
    _run(
        parent, "quarl_actorq", "medium", "ok", {"speedup_int8_vs_fp32": None}
    )  # no run reached the threshold
    table = claims_table(collect_runs(parent, tmp_path / "no_results"))
    row = table[(table.experiment == "actorq") & (table.metric == "end_to_end_speedup_min")].iloc[0]
    assert row.ours is None and row.preset == "medium" and row.holds == "no value in the finished run"


def test_a_rerun_keeps_the_training_time_of_the_attempt_that_trained(tmp_path, monkeypatch):
    import papermill

    from rlq.core.jsonio import read_json
    from rlq.experiments import runner

    class Tiny:
        name, path, parameters = "tiny", tmp_path / "tiny.ipynb", {}

    clock = iter([0.0, 1900.0, 2000.0, 2013.0])  # trains for 1900 s, then a re-analysis takes 13 s
    monkeypatch.setattr(runner.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(papermill, "execute_notebook", lambda *a, **k: None)
    monkeypatch.setattr(runner, "get_experiment", lambda name: Tiny())
    path = new_run_dir(tmp_path / "runs", "tiny")
    runner.execute(Tiny(), {}, path)
    assert read_json(path / "results.json")["train_seconds"] == 1900.0
    runner.resume_run(path, rerun=True, progress=False)
    results = read_json(path / "results.json")
    assert results["run_seconds"] == 13.0 and results["train_seconds"] == 1900.0
