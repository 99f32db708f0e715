"""Plotly figures both papers' notebooks share: the template, a learning curve, intervals and speed ratios against targets (each paper's own are in its package)."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

TEMPLATE = "plotly_white"


def learning_curve_figure(
    curve: pd.DataFrame,
    window: int = 10,
    title: str = "Learning curve",
    reference: dict[str, float] | None = None,
) -> go.Figure:
    """Return episode return vs timestep: each episode as a faint dot, a rolling mean as a line.

    ``reference`` draws horizontal lines, e.g. ``{"random policy": 22.0}``.
    """
    fig = go.Figure()
    if len(curve):
        fig.add_scatter(
            x=curve["timestep"],
            y=curve["episode_return"],
            mode="markers",
            name="episode",
            marker=dict(size=4, opacity=0.3),
        )
        smooth = curve["episode_return"].rolling(window, min_periods=1).mean()
        fig.add_scatter(x=curve["timestep"], y=smooth, mode="lines", name=f"mean of last {window}")
    for label, value in (reference or {}).items():
        fig.add_hline(y=value, line_dash="dash", annotation_text=label)
    fig.update_layout(
        title=title, xaxis_title="environment steps", yaxis_title="episode return", template=TEMPLATE
    )
    return fig


def interval_figure(
    table: pd.DataFrame,
    metric: str = "iqm",
    title: str = "IQM over seeds with 95% interval",
    unit: str = "",
    reference: dict[str, float] | None = None,
    label: str = "method",
) -> go.Figure:
    """Return a point-and-interval figure: one row per ``label`` value of ``table`` at ``metric``, seeds in the name.

    ``table`` is :func:`rlq.stats.interval_estimates`'s (columns ``method, metric, value, lower,
    upper, n``), optionally with another label column; ``reference`` draws vertical lines (e.g. the paper's).
    """
    rows = table[table["metric"] == metric] if "metric" in table.columns else table
    names = [f"{name} (n={n})" for name, n in zip(rows[label], rows["n"], strict=True)]
    fig = go.Figure()
    fig.add_scatter(
        x=rows["value"],
        y=names,
        mode="markers",
        marker=dict(size=10),
        error_x=dict(
            type="data",
            symmetric=False,
            array=(rows["upper"] - rows["value"]).tolist(),
            arrayminus=(rows["value"] - rows["lower"]).tolist(),
        ),
        name=metric.upper() if metric == "iqm" else metric,
        hovertemplate="%{y}: %{x:.3g}<extra></extra>",
    )
    for text, value in (reference or {}).items():
        fig.add_vline(x=value, line_dash="dash", annotation_text=text)
    axis = f"{metric.upper() if metric == 'iqm' else metric}" + (f" ({unit})" if unit else "")
    fig.update_layout(
        title=title, xaxis_title=axis, template=TEMPLATE, height=140 + 40 * len(names), showlegend=False
    )
    fig.update_yaxes(autorange="reversed")
    return fig


def target_ratio_figure(
    ratios: pd.DataFrame, targets: dict[str, float], title: str, label: str = "method"
) -> go.Figure:
    """Return one panel per ``targets`` column of ``ratios``: each run's ratio per ``label``, the target dashed.

    ``ratios`` has one row per run (a ``label`` column, a ``seed`` column and one column per target, e.g.
    ``"vs ORT int8 dense"``); ``targets`` maps each such column to the ratio it should reach.
    """
    missing = [c for c in (label, "seed", *targets) if c not in ratios.columns]
    if missing:
        raise ValueError(f"no column {missing} in the ratios table; it has {list(ratios.columns)}")
    long = ratios.melt(
        id_vars=[label, "seed"], value_vars=list(targets), var_name="against", value_name="x faster"
    )
    fig = px.strip(
        long,
        x=label,
        y="x faster",
        color=label,
        facet_col="against",
        hover_data=["seed"],
        title=title,
        category_orders={"against": list(targets)},
    )
    for column, target in enumerate(targets.values(), start=1):
        fig.add_hline(y=target, line_dash="dash", col=column)
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))  # "against=vs X" -> "vs X"
    fig.update_layout(template=TEMPLATE)
    return fig
