"""The report's forest plots: per claim family, the paper's value or range as a band, ours with its interval.

Each family's claims are drawn in their own unit; a family whose claims use several units (QuaRL's reward
drop in % and its bit widths) gets one panel per unit in the same figure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlq.analysis.shared_figures import TEMPLATE
from rlq.faces.report_text import interval, paper_text, sig

if TYPE_CHECKING:
    from rlq.faces.report_confirmatory import DecidedClaim

COLOURS = {
    "holds": "#1a7f37",
    "does not hold": "#cf222e",
    "inconclusive": "#9a6700",
    "too few seeds": "#6e7781",
    "by design": "#0969da",
    "uninformative (ceiling)": "#8250df",
}
PAPER_BAND = "rgba(84, 130, 214, 0.28)"
PAPER_LINE = "rgb(84, 130, 214)"
ROW_HEIGHT = 46
PANEL_EXTRA = 60


def _unit_title(unit: Any) -> str:
    return str(unit) if isinstance(unit, str) and unit else "value"


def _paper_shapes(fig: go.Figure, rows: pd.DataFrame, panel: int) -> None:
    for y, r in enumerate(rows.itertuples()):
        ref = dict(row=panel, col=1)
        if r.paper_low is not None and not pd.isna(r.paper_low) and r.paper_low != r.paper_high:
            fig.add_shape(
                type="rect",
                x0=r.paper_low,
                x1=r.paper_high,
                y0=y - 0.32,
                y1=y + 0.32,
                fillcolor=PAPER_BAND,
                line_width=0,
                layer="below",
                **ref,
            )
        else:
            fig.add_shape(
                type="line",
                x0=r.paper_value,
                x1=r.paper_value,
                y0=y - 0.36,
                y1=y + 0.36,
                line=dict(color=PAPER_LINE, width=4),
                layer="below",
                **ref,
            )


def _ours_trace(rows: pd.DataFrame, verdict: str, positions: dict[int, int]) -> go.Scatter | None:
    chosen = rows[rows["verdict"] == verdict]
    if chosen.empty:
        return None
    lower = chosen["lower"].fillna(chosen["ours"]).astype(float)
    upper = chosen["upper"].fillna(chosen["ours"]).astype(float)
    ours = chosen["ours"].astype(float)
    hover = [
        f"{r.claim}<br>ours: {interval(r.ours, r.lower, r.upper, r.unit)}<br>"
        f"paper: {paper_text(r.paper_value, r.paper_low, r.paper_high, r.unit)}<br>"
        f"rule: {r.rule}<br>{r.verdict}: {r.reason}"
        + (f"<br>{r.setting}" if isinstance(r.setting, str) and r.setting else "")
        for r in chosen.itertuples()
    ]
    return go.Scatter(
        x=ours,
        y=[positions[i] for i in chosen.index],
        mode="markers",
        name=f"ours: {verdict}",
        legendgroup=verdict,
        marker=dict(color=COLOURS[verdict], size=11, symbol="diamond"),
        error_x=dict(type="data", symmetric=False, array=upper - ours, arrayminus=ours - lower, thickness=2),
        hovertext=hover,
        hoverinfo="text",
    )


def _threshold_trace(rows: pd.DataFrame, positions: dict[int, int]) -> go.Scatter | None:
    chosen = rows[rows["threshold"].notna()]
    different = [
        i
        for i, r in chosen.iterrows()
        if r["threshold"] not in (r["paper_value"], r["paper_low"], r["paper_high"])
    ]
    if not different:
        return None
    chosen = chosen.loc[different]
    return go.Scatter(
        x=chosen["threshold"].astype(float),
        y=[positions[i] for i in chosen.index],
        mode="markers",
        name="rule's threshold",
        legendgroup="threshold",
        marker=dict(symbol="line-ns-open", size=22, color="#57606a", line=dict(width=2, color="#57606a")),
        hovertext=[f"{r.claim}: {r.rule} (threshold {sig(r.threshold)})" for r in chosen.itertuples()],
        hoverinfo="text",
    )


def _x_range(rows: pd.DataFrame) -> list[float]:
    """Return an x range holding the paper's values, our intervals and the thresholds, with a margin."""
    columns = ["paper_value", "paper_low", "paper_high", "ours", "lower", "upper", "threshold"]
    values = pd.to_numeric(rows[columns].stack(), errors="coerce").dropna()
    low, high = float(values.min()), float(values.max())
    pad = (high - low) * 0.08 or max(abs(high) * 0.1, 1.0)
    return [low - pad, high + pad]


def _legend_entries(fig: go.Figure) -> None:
    """Add legend-only markers for the paper's range and value, which shapes do not list."""
    fig.add_scatter(
        x=[None],
        y=[None],
        mode="markers",
        name="paper: range",
        marker=dict(symbol="square", size=14, color=PAPER_BAND),
        legendgroup="paper",
    )
    fig.add_scatter(
        x=[None],
        y=[None],
        mode="markers",
        name="paper: value",
        marker=dict(symbol="line-ns-open", size=16, color=PAPER_LINE, line=dict(width=4, color=PAPER_LINE)),
        legendgroup="paper",
    )


def family_figure(rows: pd.DataFrame, family: str) -> go.Figure:
    """Return the forest plot of one claim family: a panel per unit, a row per claim (setting)."""
    units = list(dict.fromkeys(rows["unit"].fillna("").astype(str)))
    heights = [max((rows["unit"].fillna("").astype(str) == u).sum(), 1) for u in units]
    fig = make_subplots(
        rows=len(units),
        cols=1,
        row_heights=heights,
        vertical_spacing=0.18 if len(units) > 1 else 0.1,
    )
    shown: set[str] = set()
    for panel, unit in enumerate(units, start=1):
        part = rows[rows["unit"].fillna("").astype(str) == unit]
        positions = {index: y for y, index in enumerate(part.index)}
        _paper_shapes(fig, part, panel)
        traces = [_ours_trace(part, v, positions) for v in COLOURS] + [_threshold_trace(part, positions)]
        for trace in traces:
            if trace is None:
                continue
            trace.showlegend = trace.legendgroup not in shown
            shown.add(trace.legendgroup)
            fig.add_trace(trace, row=panel, col=1)
        labels = [r.claim + ("" if r.verdict in COLOURS else " (not measured)") for r in part.itertuples()]
        fig.update_yaxes(
            tickvals=list(range(len(part))),
            ticktext=labels,
            range=[len(part) - 0.5, -0.5],
            automargin=True,
            row=panel,
            col=1,
        )
        fig.update_xaxes(
            title_text=_unit_title(unit), range=_x_range(part), automargin=True, row=panel, col=1
        )
    _legend_entries(fig)
    fig.update_layout(
        title=dict(text=family, x=0),
        template=TEMPLATE,
        height=PANEL_EXTRA * len(units) + ROW_HEIGHT * sum(heights) + 90,
        margin=dict(l=10, r=10, t=50, b=40),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1),
        hovermode="closest",
    )
    return fig


def plotted_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Return the claims table's rows a forest plot draws: current metrics with a number, one per claim and preset.

    Each row's label names its preset; a joint claim has no number of its own (its parts are drawn).
    """
    keep = (table["status"] == "current") & ~table["replication"] & table["ours"].notna()
    rows = table[keep].copy()
    rows["claim"] = [f"{c} ({p})" for c, p in zip(rows["claim"], rows["preset"], strict=True)]
    return rows


def family_figures(table: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    """Return (family, forest plot) for every claim family with a measured number, in the table's order."""
    rows = plotted_rows(table)
    return [(family, family_figure(part, family)) for family, part in rows.groupby("family", sort=False)]


CONFIRMATORY_ROW_HEIGHT = 100


def confirmatory_figure(decided: list[DecidedClaim]) -> go.Figure:
    """Return the evidence behind each confirmatory verdict: a panel per claim, in the claim's own unit.

    Grey dots are the per-seed (or per-pair) values, the diamond their mean, coloured by the verdict, with a
    bar to its one-sided 95% t bound on the side the test reads (the lower bound for "at least"), and the
    dashed line the registered threshold.
    """
    fig = make_subplots(
        rows=max(len(decided), 1),
        cols=1,
        subplot_titles=[
            f"{d.claim.label}: <b>{d.outcome.outcome}</b> (n = {d.outcome.n}; {_unit_title(d.claim.unit)}, "
            f"threshold {d.claim.threshold:g})"
            for d in decided
        ],
        vertical_spacing=0.45 / max(len(decided), 1),
    )
    for row, d in enumerate(decided, start=1):
        b, claim = d.outcome.bounds, d.claim
        bound = b.lower if claim.direction == ">=" else b.upper
        fig.add_trace(
            go.Scatter(
                x=d.values, y=[0.0] * len(d.values), mode="markers", name="per seed",
                legendgroup="per seed",
                marker=dict(color="rgba(110, 119, 129, 0.55)", size=10, line=dict(width=1, color="white")),
                hovertemplate="%{x:.4g}<extra>one seed</extra>",
            ),
            row=row, col=1,
        )  # fmt: skip
        fig.add_trace(
            go.Scatter(
                x=[b.mean], y=[0.0], mode="markers", name=d.outcome.outcome, legendgroup=d.outcome.outcome,
                marker=dict(symbol="diamond", size=14, color=COLOURS.get(d.outcome.outcome, PAPER_LINE)),
                error_x=dict(
                    type="data", symmetric=False, array=[max(bound - b.mean, 0.0)],
                    arrayminus=[max(b.mean - bound, 0.0)], thickness=2, width=0,
                ),
                hovertemplate=f"mean %{{x:.4g}}, one-sided bound {bound:.4g}<extra></extra>",
            ),
            row=row, col=1,
        )  # fmt: skip
        fig.add_vline(x=claim.threshold, line=dict(color="#24292f", dash="dash", width=1.5), row=row, col=1)
        fig.update_yaxes(visible=False, range=[-1, 1], row=row, col=1)
        low, high = min(*d.values, bound, claim.threshold), max(*d.values, bound, claim.threshold)
        pad = 0.06 * (high - low or 1.0)
        fig.update_xaxes(range=[low - pad, high + pad], row=row, col=1)
    seen: set[str] = set()
    for trace in fig.data:  # one legend entry per verdict
        trace.showlegend = trace.legendgroup not in seen
        seen.add(trace.legendgroup)
    fig.update_layout(
        title=dict(text="Confirmatory verdicts: the values behind each", x=0),
        template=TEMPLATE,
        height=CONFIRMATORY_ROW_HEIGHT * max(len(decided), 1) + 110,
        margin=dict(l=20, r=20, t=90, b=40),
        legend=dict(orientation="h", yanchor="top", y=0.99, yref="container", xanchor="right", x=1),
        hovermode="closest",
    )
    return fig
