"""Plotly figures both papers' notebooks share: the template and a learning curve (each paper's own are in its package)."""

from __future__ import annotations

import pandas as pd
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
