"""The figure of the values behind each confirmatory verdict: drawn from the published tables, shown in claims.md."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from scipy import stats

from rlq.faces.report_confirmatory import decided_claims
from rlq.faces.report_figures import COLOURS, confirmatory_figure
from rlq.faces.static_figures import CONFIRMATORY_PNG

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "data" / "results"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def decided():
    return decided_claims(ROOT)


def _panels(figure: go.Figure) -> list[tuple[go.Scatter, go.Scatter]]:
    """Return (per-seed dots, mean diamond) of each panel, in order."""
    traces = list(figure.data)
    return list(zip(traces[::2], traces[1::2], strict=True))


def test_football_scores_are_gst_minus_dense_per_seed_from_the_published_summary(decided):
    summary = pd.read_csv(RESULTS / "gst_ppo_football" / "confirmatory_medium_2" / "summary.csv")
    summary = summary[summary["seed"] >= 1000]  # the pilot (seed 901) is exploratory
    goals = summary.pivot(index="seed", columns="method", values="eval_return").sort_index()
    by_id = {d.claim.id: d for d in decided}
    assert by_id["gst_football_reward"].values.tolist() == pytest.approx(
        (goals["gst"] - goals["dense"]).tolist()
    )
    compression = summary[summary["method"] == "gst"].sort_values("seed")["avg_compression_ratio"]
    assert by_id["gst_football_compression"].values.tolist() == pytest.approx((100 * compression).tolist())


def test_each_panel_draws_the_values_their_mean_the_one_sided_bound_and_the_threshold(decided):
    assert {d.outcome.outcome for d in decided} <= {"holds", "does not hold", "inconclusive"}
    assert not any(d.claim.statistic == "joint" for d in decided)
    figure = confirmatory_figure(decided)
    panels = _panels(figure)
    assert len(panels) == len(decided) >= 9
    lines = [shape for shape in figure.layout.shapes if shape.line.dash == "dash"]
    assert len(lines) == len(decided)
    for d, (dots, diamond), line in zip(decided, panels, lines, strict=True):
        values = np.asarray(d.values, dtype=float)
        n = len(values)
        half = stats.t.ppf(0.95, n - 1) * values.std(ddof=1) / np.sqrt(n)  # independent of rlq's t_bounds
        assert sorted(dots.x) == pytest.approx(sorted(values)) and n == d.outcome.n
        assert diamond.x[0] == pytest.approx(values.mean())
        assert d.claim.direction == ">="  # the lower bound is the one read: a bar down to it, none up
        assert diamond.error_x.arrayminus[0] == pytest.approx(half) and diamond.error_x.array[0] == 0
        assert line.x0 == line.x1 == d.claim.threshold
        assert diamond.marker.color == COLOURS[d.outcome.outcome]
        low, high = figure.layout[f"xaxis{'' if line.xref == 'x' else line.xref[1:]}"].range
        assert low < min(*values, values.mean() - half, d.claim.threshold)
        assert high > max(*values, d.claim.threshold)


def test_a_claim_read_at_its_upper_bound_gets_a_bar_up_to_it(decided):
    """A claim "at most T" compares the upper bound: the bar runs from the mean up, none down."""
    first = decided[0]
    flipped = dataclasses.replace(first, claim=dataclasses.replace(first.claim, direction="<="))
    (_, diamond), *_ = _panels(confirmatory_figure([flipped]))
    bounds = first.outcome.bounds
    assert diamond.error_x.array[0] == pytest.approx(bounds.upper - bounds.mean)
    assert diamond.error_x.arrayminus[0] == 0


def test_the_figure_is_committed_and_shown_in_the_claims_page():
    png = ROOT / "docs" / "figures" / CONFIRMATORY_PNG
    assert png.read_bytes().startswith(PNG_SIGNATURE), f"run `rlq report --figures` and commit {png}"
    assert f"](figures/{CONFIRMATORY_PNG})" in (ROOT / "docs" / "claims.md").read_text()


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("chromium") is None and os.environ.get("CI") != "true",
    reason="rendering PNGs needs Debian's chromium (apt install chromium; .ci/run installs it)",
)
def test_render_writes_the_figure_at_its_own_height(tmp_path, decided):
    from rlq.faces.static_figures import render_confirmatory_figure

    written = render_confirmatory_figure(tmp_path, ROOT)
    assert written == [tmp_path / CONFIRMATORY_PNG]
    data = written[0].read_bytes()
    height = int(confirmatory_figure(decided).layout.height)
    assert data.startswith(PNG_SIGNATURE) and height > 900
    assert int.from_bytes(data[16:20], "big") == 900 and int.from_bytes(data[20:24], "big") == height
