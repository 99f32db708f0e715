"""rlq report on synthetic run folders: verdicts from the best finished run, portable numbers and paths."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlq.claims.spec import claim_specs
from rlq.core.jsonio import read_json
from rlq.experiments.paths import repo_root
from rlq.experiments.run_folders import new_run_dir
from rlq.faces.cli import main
from rlq.faces.report import build_report, claims_table, collect_runs, counts, paper_sections, runs_table
from rlq.faces.report_text import Paths, duration, interval, sig

NOTEBOOK = "output.ipynb"
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:tmp|home|work|root|Users|var|private|mnt)/")


def _run(parent, experiment, preset, status, results, params=None, finished="20261130T000000Z", files=None):
    path = new_run_dir(parent, experiment)
    (path / "params.json").write_text(json.dumps(params or {"seed": 0}))
    body = {"status": status, "experiment": experiment, "preset": preset, "finished": finished, **results}
    (path / "results.json").write_text(json.dumps(body))
    for name, text in (files or {}).items():  # e.g. the executed notebook, an archived attempt
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


def _estimate(value, lower, upper, n):
    return {"value": value, "lower": lower, "upper": upper, "n": n}


def synthetic_runs(parent: Path) -> Path:
    """Make one holding claim, one failing, one failed run and one re-analysed run under ``parent``."""
    _run(  # holds: a 1.23% int8 drop, its whole interval below the paper's 0 + 5
        parent,
        "quarl_ptq",
        "medium",
        "ok",
        {
            "estimates": {"int8_reward_drop_pct": _estimate(1.23456, 0.51234, 2.04321, 5)},
            "train_seconds": 700.0,
        },
        params={"seeds": [0, 1, 2, 3, 4]},
        files={NOTEBOOK: "{}"},
    )
    _run(  # does not hold: 40% average compression, far below the paper's 71.9 - 5
        parent,
        "gst_a2c_atari",
        "medium",
        "ok",
        {
            "estimates": {"avg_compression_gst_pct": _estimate(40.1234, 35.3, 44.9, 5)},
            "train_seconds": 1500.0,
        },
        params={"seeds": [0, 1, 2, 3, 4]},
        files={NOTEBOOK: "{}"},
    )
    failed = parent / "gst_classification"
    _run(
        parent, "gst_classification", "medium", "failed", {"error": f"FileNotFoundError: {failed}/x/data.npz"}
    )
    _run(  # too few seeds; re-analysed: trained 1920 s in attempt 1, then `rlq run --resume DIR --rerun` took 13 s
        parent,
        "gst_td3_mujoco",
        "medium",
        "ok",
        {
            "estimates": {"gain_gst_vs_pruning_pp": _estimate(27.243972, 12.123456, 30.249, 3)},
            "run_seconds": 13.0,
        },
        params={"seeds": [0, 1, 2]},
        files={
            NOTEBOOK: "{}",
            "attempts/1/results.json": json.dumps({"status": "ok", "run_seconds": 1920.0}),
        },
    )
    return parent


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Return the HTML report of the synthetic runs, its text and the runs folder (built once: ~2 s)."""
    base = tmp_path_factory.mktemp("report")
    runs = synthetic_runs(base / "runs")
    out, text = build_report(runs, base / "report.html", base / "no_results", formats=("html", "md"))
    return out, text, runs


def test_numbers_are_rounded_to_three_significant_figures():
    assert [sig(v) for v in (27.243972, 0.557103, 1934.5, 9.996, 12.0, 0.0, -0.647)] == [
        "27.2",
        "0.557",
        "1930",
        "10.0",
        "12",
        "0",
        "-0.647",
    ]
    assert interval(27.243972, 12.123456, 30.249, "%p") == "27.2 [12.1, 30.2] %p"
    assert interval(64.7, 64.7, 64.7, "%") == "64.7%"  # a point value shows no interval
    assert [duration(s) for s in (13.0, 1920.0, 9000.0, None)] == ["13 s", "32 min", "2.5 h", ""]


def test_paths_are_relative_to_the_report_or_the_project(tmp_path):
    paths = Paths(tmp_path / "out" / "report.html", repo_root())
    assert paths.link(tmp_path / "out" / "runs" / "a" / "output.ipynb") == "runs/a/output.ipynb"
    assert paths.label(repo_root() / "data" / "results" / "x") == "data/results/x"
    assert paths.link(repo_root() / "data") is None  # from outside the project only a machine path reaches it
    scrubbed = paths.scrub(f"OSError: {tmp_path}/out/runs/a/b.csv and /opt/elsewhere/c.npz missing")
    assert scrubbed == "OSError: runs/a/b.csv and .../c.npz missing"
    inside = Paths(repo_root() / "runs" / "report.html", repo_root())
    assert inside.link(repo_root() / "data" / "results" / "x") == "../data/results/x"


CURRENT = len({s.id for s in claim_specs(current_only=True)})


def _row(table, claim_id, preset, version=None):
    rows = table[(table.id == claim_id) & (table.preset == preset) & ~table.replication]
    rows = rows[rows.status == "current"] if version is None else rows[rows.version == version]
    return rows.iloc[0]


def test_verdicts_come_from_the_run_of_each_preset_and_the_interval_rule(report):
    _, _, runs = report
    table = claims_table(collect_runs(runs, runs.parent / "no_results"))
    specs = claim_specs()
    assert len(table[~table.replication]) == sum(len(s.presets) for s in specs)  # every claim on every preset
    assert counts(table) == {
        "claims": CURRENT, "measured": 3, "holds": 1, "does not hold": 1, "too few seeds": 1,
        "not measured": CURRENT - 3,
    }  # fmt: skip
    drop = _row(table, "quarl_ptq_int8", "medium")
    assert drop.verdict == "holds" and drop.n == 5 and drop.unit == "%" and drop.overall == "holds"
    gain = _row(table, "gst_td3_gain", "medium")
    assert (gain.paper_low, gain.paper_high) == (25.0, 41.5)  # the paper's range from its _min/_max rows
    assert gain.verdict == "too few seeds" and gain.reason == "3 of the 5 seeds the claim needs"
    assert gain.ours == 27.243972  # the point value is shown
    assert _row(table, "gst_td3_gain", "long").verdict == "not measured"
    cifar = _row(table, "gst_cifar10_compression", "medium")
    assert cifar.verdict == "not measured" and cifar.reason == "no finished run"  # its only run failed


def test_each_preset_is_judged_and_the_longest_with_enough_seeds_decides(tmp_path):
    parent = tmp_path / "runs"
    medium = {"estimates": {"reward_drop_paired_gst_vs_dense_pct": _estimate(30.0, 12.0, 60.0, 10)}}
    long = {"estimates": {"reward_drop_paired_gst_vs_dense_pct": _estimate(2.0, -4.0, 8.0, 10)}}
    _run(
        parent, "gst_td3_mujoco", "quick", "ok", long, finished="20261201T000000Z"
    )  # not a preset of the claim
    _run(parent, "gst_td3_mujoco", "medium", "ok", medium)
    _run(parent, "gst_td3_mujoco", "long", "ok", long)
    _run(parent, "gst_td3_mujoco", "paper", "failed", {"error": "RuntimeError: boom"})
    table = claims_table(collect_runs(parent, tmp_path / "no_results"))
    assert (_row(table, "gst_td3_reward", "medium").verdict, _row(table, "gst_td3_reward", "long").verdict) == (
        "does not hold", "holds",
    )  # fmt: skip
    row = _row(table, "gst_td3_reward", "long")
    assert row.overall == "holds" and row.decides
    assert row.overall_reason == "decided on long; contradicted by medium (does not hold)"
    assert set(table[table.id == "gst_td3_reward"].preset) == {"medium", "long"}
    _run(parent, "gst_td3_mujoco", "long", "ok", medium, finished="20261202T000000Z")  # a replication
    table = claims_table(collect_runs(parent, tmp_path / "no_results"))
    rows = table[(table.id == "gst_td3_reward") & (table.preset == "long") & (table.status == "current")]
    assert list(rows.replication) == [False, True] and list(rows.verdict) == ["does not hold", "holds"]
    assert (
        rows.iloc[0].run.results["finished"] == "20261202T000000Z"
    )  # the newest answers; the other is shown


def test_runs_table_keeps_the_training_time_of_a_reanalysed_run(report, tmp_path):
    out, _, runs = report
    table = runs_table(collect_runs(runs, tmp_path / "no_results"), Paths(out, repo_root())).set_index(
        "experiment"
    )
    assert table.loc["gst_td3_mujoco", "train_seconds"] == 1920.0  # not the 13 s of its re-analysis
    assert table.loc["gst_td3_mujoco", "status"] == "ok, re-analysed"
    assert table.loc["quarl_ptq", "train_seconds"] == 700.0
    assert table.loc["gst_classification", "error"] == "FileNotFoundError: runs/gst_classification/x/data.npz"
    assert table.loc["gst_a2c_atari", "link"].startswith("runs/gst_a2c_atari/")


def test_paper_settings_and_later_work_are_apart_from_the_claims():
    used, later = paper_sections()
    assert "block size" in set(used.metric) and "layer coverage" in set(used.metric)
    assert used[used.metric == "layer coverage"].value.iloc[0] == "94 to 99"  # a _min/_max pair is one row
    assert "int8 reward drop" not in set(used.metric)  # claimed rows sit in the verdicts, not here
    assert len(later) and "RLx2" in " ".join(later.note.fillna(""))


def test_the_page_leads_with_verdicts_and_holds_no_machine_path(report):
    out, text, runs = report
    page = out.read_text()
    assert page.index("verdict-counts") < page.index("class='verdicts'") < page.index("plotly")
    assert page.count("<div class='figure'") == 2  # the families with a number: QuaRL's PTQ; GST compression
    assert page.count("Plotly.newPlot") == 2
    assert page.count("* plotly.js v") == 1  # one inline copy of plotly.js (its banner names the version)
    assert "27.2 [12.1, 30.2] %p" in page and "1.23 [0.512, 2.04]%" in page and "27.243972" not in page
    assert "href='runs/gst_td3_mujoco/" in page and "output.ipynb'>notebook</a>" in page
    assert "32 min" in page and "ok, re-analysed" in page
    assert "What the papers used" in page and "What later work reports" in page
    assert "<details>" in page
    for doc in (page, text, out.with_suffix(".md").read_text()):
        assert str(runs.parent) not in doc and str(repo_root()) not in doc
        assert not ABSOLUTE_PATH.search(doc)
    first = text.splitlines()
    assert first[0] == (
        f"{CURRENT} claims, 3 measured: 1 hold, 1 do not hold, 1 too few seeds, {CURRENT - 3} not measured; "
        "4 runs (1 failed)"
    )
    assert first[1].startswith("claim") and "on the preset" in first[1]
    ptq = next(line for line in first if "PTQ: int8 reward drop" in line)
    assert "1.23 [0.512, 2.04]%" in ptq and "5/5" in ptq and "holds (decided on medium)" in ptq


def test_markdown_verdict_table(report):
    out, _, _ = report
    md = out.with_suffix(".md").read_text().splitlines()
    assert md[0].startswith(f"**{CURRENT} claims, 3 measured")
    assert md[2] == "| Claim | Paper | Ours on each preset [95% interval] | Claim's verdict |"
    rows = [line for line in md[4:] if line.startswith("| ")]
    assert len(rows) == CURRENT  # one row per current claim, its presets side by side
    holds = next(r for r in rows if "int8 reward drop" in r)
    assert (
        "| 0% | medium: 1.23 [0.512, 2.04]% (n = 5; needs 5), **holds** | holds (decided on medium) |"
        in holds
    )
    gain = next(r for r in rows if "gain over iterative pruning" in r)
    assert (
        "medium: 27.2 [12.1, 30.2] %p (n = 3; needs 5), **too few seeds**<br>long: **not measured**" in gain
    )


def test_the_cli_writes_markdown_on_request_and_prints_the_paths(report, tmp_path, capsys):
    _, _, runs = report
    assert main(["report", "--runs", str(runs), "--out", str(tmp_path / "r2.html")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == str(tmp_path / "r2.html") and not (tmp_path / "r2.md").exists()
    assert main(["report", "--runs", str(runs), "--out", str(tmp_path / "r3.html"), "--format", "md"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert (
        lines[-2:] == [str(tmp_path / "r3.html"), str(tmp_path / "r3.md")] and (tmp_path / "r3.md").is_file()
    )


def test_a_claim_measured_in_another_setting_says_so(tmp_path):
    parent = tmp_path / "runs"
    estimates = {"gst_accuracy_drop_pp": _estimate(0.5, 0.1, 1.0, 5)}
    _run(parent, "gst_classification", "medium", "ok", {"dataset": "digits", "estimates": estimates})
    table = claims_table(collect_runs(parent, tmp_path / "no_results"))
    row = _row(table, "gst_cifar10_accuracy", "medium")
    # digits cannot decide a CIFAR-10 claim: inconclusive, saying what the rule gives on digits
    assert row.verdict == "inconclusive" and row.setting == "dataset digits"
    assert row.reason == (
        "not the paper's setting (dataset is digits, not cifar10); on this run the rule says holds"
    )
    _run(parent, "gst_classification", "medium", "ok", {"dataset": "cifar10", "estimates": estimates},
         finished="20261201T000000Z")  # fmt: skip
    table = claims_table(collect_runs(parent, tmp_path / "no_results"))
    assert _row(table, "gst_cifar10_accuracy", "medium").verdict == "holds"  # the same numbers on CIFAR-10


def test_a_finished_run_without_the_number_says_so(tmp_path):
    parent = tmp_path / "runs"
    _run(
        parent, "quarl_actorq", "medium", "ok", {"speedup_int8_vs_fp32": None}
    )  # no run reached the threshold
    table = claims_table(collect_runs(parent, tmp_path / "no_results"))
    row = _row(table, "actorq_speedup", "medium")
    assert row.verdict == "not measured" and "no number" in row.reason


def test_a_rerun_keeps_the_training_time_of_the_attempt_that_trained(tmp_path, monkeypatch):
    import papermill

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


def test_a_variant_of_its_preset_answers_no_claim(tmp_path):
    """An ablation (a non-free parameter changed with -p) newer than the preset's own run does not replace it."""
    preset_run = {"seeds": [0, 1, 2], "methods": ["dense", "gst", "gst_bc_only"]}
    good = _estimate(70.0, 69.0, 71.0, 5)
    _run(
        tmp_path,
        "gst_a2c_atari",
        "medium",
        "ok",
        {"estimates": {"avg_compression_gst_pct": good}},
        params=preset_run,
        finished="20261130T000000Z",
    )
    ablation = _estimate(10.0, 9.0, 11.0, 3)
    _run(
        tmp_path,
        "gst_a2c_atari",
        "medium",
        "ok",
        {"estimates": {"avg_compression_gst_pct": ablation}},
        params={**preset_run, "bc_end": 1.0},
        finished="20261130T010000Z",
    )
    records = collect_runs(tmp_path, tmp_path / "no_published_results")
    assert sorted(r.variant_of_preset == ["bc_end"] for r in records) == [False, True]
    table = claims_table(records)
    assert _row(table, "gst_a2c_compression", "medium").ours == 70.0
    assert len(table[(table.id == "gst_a2c_compression") & (table.preset == "medium")]) == 1
    runs = runs_table(records, Paths(tmp_path / "report.html", tmp_path))
    assert runs["status"].str.contains("variant of its preset in: bc_end").sum() == 1


def test_a_damaged_results_file_is_listed_unreadable_and_the_report_goes_on(tmp_path):
    parent = tmp_path / "runs"
    estimates = {"gst_final_compression_pct": _estimate(69.8, 68.0, 71.0, 5)}
    good = _run(parent, "gst_classification", "medium", "ok", {"dataset": "cifar10", "estimates": estimates})
    bad = _run(parent, "gst_classification", "medium", "ok", {}, finished="20261201T000000Z")
    (bad / "results.json").write_text('{"status": "ok", "experi')  # cut off mid-write
    published = tmp_path / "results" / "gst_td3_mujoco" / "medium"
    published.mkdir(parents=True)
    (published / "results.json").write_text("not json")
    (published / "params.json").write_text("{}")
    (good / "attempts" / "1").mkdir(parents=True)
    (good / "attempts" / "1" / "results.json").write_text("{")  # a damaged archived attempt
    records = collect_runs(parent, tmp_path / "results")
    assert sorted(r.status for r in records) == ["ok", "unreadable", "unreadable"]
    assert "results.json" in next(r for r in records if r.path == bad).results["error"]
    out, text = build_report(parent, tmp_path / "r.html", tmp_path / "results")
    assert out.exists() and "unreadable" in out.read_text()
    row = _row(claims_table(records), "gst_cifar10_compression", "medium")
    assert row.verdict == "holds" and good.name in str(row.run)


def test_the_printed_report_names_the_runs_it_skipped_as_unreadable_after_the_table(tmp_path):
    from rlq.faces.report import text_report

    parent = tmp_path / "runs"
    _run(parent, "gst_classification", "medium", "ok", {})
    bad = _run(parent, "gst_classification", "paper", "ok", {})
    (bad / "results.json").write_text('{"status": "ok", "experi')  # cut off mid-write
    published = tmp_path / "results" / "gst_td3_mujoco" / "medium"
    published.mkdir(parents=True)
    (published / "results.json").write_text("not json")
    (published / "params.json").write_text("{}")
    records = collect_runs(parent, tmp_path / "results")
    runs = runs_table(records, Paths(parent / "report.html", tmp_path))
    lines = text_report(claims_table(records), runs).splitlines()
    assert lines[-2:] == [
        f"skipped, unreadable: runs/gst_classification/{bad.name} (runs/gst_classification/{bad.name}/results.json "
        "is damaged: not valid JSON (Unterminated string starting at: line 1 column 18 (char 17)))",
        "skipped, unreadable: results/gst_td3_mujoco/medium (results/gst_td3_mujoco/medium/results.json is "
        "damaged: not valid JSON (Expecting value: line 1 column 1 (char 0)))",
    ]


def test_a_reason_is_cut_at_its_first_clause_for_the_markdown_table():
    from rlq.faces.report import _short

    assert _short("decided on long; contradicted by medium") == "decided on long"
    assert (
        _short("measured in the actor_bound regime: a long description")
        == "measured in the actor_bound regime"
    )
    assert _short("x (paper: y): z") == "x (paper: y)"


def test_runs_table_says_which_runs_a_merged_run_loaded_from_earlier_folders(tmp_path):
    reused = [{"source": "a", "runs": 18, "keys": [], "train_seconds": 6586.6},
              {"source": "b", "runs": 2, "keys": [], "train_seconds": 498.8}]  # fmt: skip
    _run(tmp_path / "runs", "gst_td3_mujoco", "ablation", "ok", {"reused": reused, "train_seconds": 23.4})
    _run(tmp_path / "runs", "quarl_ptq", "medium", "ok", {"train_seconds": 700.0})
    out = tmp_path / "out"
    table = runs_table(collect_runs(tmp_path / "runs", tmp_path / "no_results"), Paths(out, repo_root()))
    table = table.set_index("experiment")
    assert table.loc["gst_td3_mujoco", "status"] == (
        "ok (20 runs loaded from 2 earlier folders, which trained for 1.8 h + 8 min)"
    )
    assert table.loc["gst_td3_mujoco", "train_seconds"] == 23.4  # this folder's own training
    assert table.loc["quarl_ptq", "status"] == "ok"
