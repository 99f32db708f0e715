"""Every committed run has headline figures built from its committed CSVs, rendered as PNGs and shown in docs/results.md."""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest

from rlq.faces.cli import build_parser
from rlq.faces.static_figures import (
    FIGURES,
    FigureError,
    committed_figures,
    committed_runs,
    render_committed_figures,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "data" / "results"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RUNS = committed_runs(RESULTS)


@functools.cache
def figures_of(experiment: str, preset: str) -> tuple:
    """Return ``committed_figures`` of one committed run, built once for this module (quarl_actorq's convergence
    figure bootstraps 80 intervals: about 25 s on 2 cores)."""
    return tuple(committed_figures(experiment, preset, RESULTS))


def test_every_committed_run_has_a_figure_builder():
    folders = {
        path.parent
        for path in RESULTS.glob("*/*/results.json")
        if not json.loads(path.read_text()).get(
            "confirmatory"
        )  # the registered design's runs: no headline figures
    }
    assert folders, "no committed run under data/results"
    assert {run.folder for run in RUNS} == folders
    missing = sorted({run.experiment for run in RUNS} - set(FIGURES))
    assert not missing, f"add a builder to rlq.faces.static_figures.FIGURES for {missing}"
    assert not (
        RESULTS / "gst_td3_mujoco" / "earlier_gst" / "results.json"
    ).exists()  # replay data, not a run


@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"{r.experiment}/{r.preset}")
def test_each_builder_returns_plotly_figures_on_the_committed_tables(run):
    figures = figures_of(run.experiment, run.preset)
    assert 1 <= len(figures) <= 3
    names = [name for name, _ in figures]
    assert len(set(names)) == len(names), names
    for name, figure in figures:
        assert name.replace("_", "").isalnum() and name.islower(), name
        assert isinstance(figure, go.Figure)
        assert figure.data, f"{run.experiment}/{run.preset}: {name} draws nothing"
        assert figure.layout.title.text, f"{run.experiment}/{run.preset}: {name} has no title"


@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"{r.experiment}/{r.preset}")
def test_each_committed_figure_is_rendered_and_shown_in_the_results_page(run):
    page = (ROOT / "docs" / "results.md").read_text()
    for name, _ in figures_of(run.experiment, run.preset):
        png = run.folder / f"{name}.png"
        assert png.is_file(), f"{png.relative_to(ROOT)} is missing: run `rlq report --figures` and commit it"
        assert png.read_bytes().startswith(PNG_SIGNATURE)
        link = f"](../{png.relative_to(ROOT).as_posix()})"
        assert link in page, f"docs/results.md shows no {png.relative_to(ROOT)}"


def test_a_broken_or_missing_table_is_an_error_naming_the_run_and_the_table(tmp_path):
    folder = tmp_path / "quarl_qat" / "medium"
    shutil.copytree(RESULTS / "quarl_qat" / "medium", folder)
    table = (folder / "qat.csv").read_text().replace("mean_return", "renamed", 1)
    (folder / "qat.csv").write_text(table)
    with pytest.raises(FigureError, match=r"quarl_qat/medium: .*qat\.csv.*mean_return"):
        committed_figures("quarl_qat", "medium", tmp_path)
    (folder / "qat.csv").unlink()
    with pytest.raises(FigureError, match=r"quarl_qat/medium: no committed table qat\.csv"):
        committed_figures("quarl_qat", "medium", tmp_path)


def test_an_experiment_without_a_builder_is_an_error(tmp_path):
    folder = tmp_path / "not_an_experiment" / "medium"
    shutil.copytree(RESULTS / "quarl_qat" / "medium", folder)
    with pytest.raises(FigureError, match="not_an_experiment/medium: no figures"):
        render_committed_figures(tmp_path)


def test_report_takes_figures():
    assert build_parser().parse_args(["report", "--figures"]).figures
    assert not build_parser().parse_args(["report"]).figures


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("chromium") is None and os.environ.get("CI") != "true",
    reason="rendering PNGs needs Debian's chromium (apt install chromium; .ci/run installs it)",
)
def test_render_writes_pngs_into_the_committed_folder(tmp_path):
    folder = tmp_path / "baseline_rl" / "medium"
    shutil.copytree(RESULTS / "baseline_rl" / "medium", folder)
    written = render_committed_figures(tmp_path)
    assert written == [folder / "learning_curve.png"]
    data = written[0].read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert 5_000 < len(data) < 120_000
    assert int.from_bytes(data[16:20], "big") == 900 and int.from_bytes(data[20:24], "big") == 450


def test_each_claim_family_has_a_forest_plot_in_the_claims_page():
    from rlq.claims.verdicts import FAMILIES
    from rlq.faces.static_figures import claims_figures

    figures = claims_figures(RESULTS)
    drawn = [
        f for f in FAMILIES if f != "GST joint"
    ]  # a joint claim has no number of its own: its parts are drawn
    assert [figure.layout.title.text for _, figure in figures] == drawn
    page = (ROOT / "docs" / "claims.md").read_text()
    for name, _ in figures:
        png = ROOT / "docs" / "figures" / f"{name}.png"
        assert png.read_bytes().startswith(PNG_SIGNATURE), (
            f"{png.relative_to(ROOT)}: run `rlq report --figures`"
        )
        assert f"](figures/{name}.png)" in page, f"docs/claims.md shows no {name}.png"


def test_the_convergence_figure_names_the_tasks_it_draws():
    figures = dict(figures_of("quarl_actorq", "convergence"))
    runs = pd.read_csv(RESULTS / "quarl_actorq" / "convergence" / "convergence_runs.csv")
    title = figures["convergence"].layout.title.text
    for task in runs["task"].unique():
        assert task in title, f"the convergence figure's title {title!r} does not name {task}"
    assert "dm_control/" not in title, f"{title!r} names the throughput sections' env id"


def test_the_block_deploy_figures_show_each_arms_iqm_and_each_runs_ratio_against_its_target(tmp_path):
    folder = tmp_path / "gst_block_deploy" / "medium"
    folder.mkdir(parents=True)
    returns = {"gst": [1.0, 2.0, 3.0, 4.0, 100.0], "gst_block": [10.0, 20.0, 30.0, 40.0, -50.0]}
    pd.DataFrame(
        [
            {"method": arm, "seed": seed, "eval_return": r}
            for arm, rs in returns.items()
            for seed, r in enumerate(rs)
        ]
    ).to_csv(folder / "summary.csv", index=False)
    latency = pd.DataFrame(
        {
            "method": ["gst", "gst", "gst_block", "gst_block"],
            "seed": [0, 1, 0, 1],
            "vs ORT int8 dense": [3.9, 4.1, 6.5, 7.0],
            "vs rlq dense int8": [1.0, 1.01, 1.6, 1.7],
        }
    )
    latency.to_csv(folder / "latency.csv", index=False)
    targets = {"vs ORT int8 dense": 2.0, "vs rlq dense int8": 1.5}
    (folder / "params.json").write_text(json.dumps({"env_id": "HalfCheetah-v5"}))
    (folder / "results.json").write_text(json.dumps({"status": "ok", "speed_targets": targets}))

    (name_r, figure_r), (name_s, figure_s) = committed_figures("gst_block_deploy", "medium", tmp_path)
    assert (name_r, name_s) == ("returns", "speed")
    # the interquartile mean of 5 values is the mean of the middle 3, each arm in its row
    iqm = {arm: sum(sorted(rs)[1:4]) / 3 for arm, rs in returns.items()}
    assert list(figure_r.data[0].x) == pytest.approx([iqm["gst"], iqm["gst_block"]])
    assert list(figure_r.data[0].y) == ["gst (n=5)", "gst_block (n=5)"]
    # every run's ratio is a point, in the panel of its measure, and each panel's dashed line is its target
    points = sorted((t.xaxis, x, y) for t in figure_s.data for x, y in zip(t.x, t.y, strict=True))
    expected = sorted(
        (axis, row.method, row[measure])
        for axis, measure in zip(("x", "x2"), targets, strict=True)
        for _, row in latency.iterrows()
    )
    assert points == expected
    lines = sorted((shape.xref, shape.y0, shape.line.dash) for shape in figure_s.layout.shapes)
    assert lines == [("x domain", 2.0, "dash"), ("x2 domain", 1.5, "dash")]
    assert "exploratory" in figure_s.layout.title.text
