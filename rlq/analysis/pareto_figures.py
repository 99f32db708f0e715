"""``combo_sparse_quant`` figures: return (IQM with 95% interval over seeds) against bits per weight and against latency.

Apart from :mod:`rlq.analysis.pareto`, so that its tables import no Plotly.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from rlq.analysis.pareto import pareto_front
from rlq.analysis.shared_figures import TEMPLATE

AXES = {
    "bits_per_weight": ("bits per weight of the deployed actor (log; dense fp32 = 32)", "log"),
    "latency_ratio": ("batch-1 latency / dense fp32's, ONNX Runtime, same process", "linear"),
}


def pareto_figure(
    summary: pd.DataFrame,
    cost: str = "bits_per_weight",
    title: str | None = None,
    reference: dict[str, float] | None = None,
) -> go.Figure:
    """Return each method's return IQM with its 95% interval against ``cost`` (``bits_per_weight`` or ``latency_ratio``), Pareto front drawn.

    ``summary`` is one task's rows of :func:`rlq.analysis.pareto.method_summary`. The front (non-dominated
    methods: no other has lower cost and higher return) is a dashed step line; dense's interval is a band.
    ``reference`` draws vertical lines, e.g. ``{"1.6 bits (20x)": 1.6}``.
    """
    if cost not in AXES:
        raise ValueError(f"cost must be one of {list(AXES)}, got {cost!r}")
    axis_title, axis_type = AXES[cost]
    table = summary.dropna(subset=[cost]).reset_index(drop=True)
    front = pareto_front(table, cost)
    fig = go.Figure()
    dense = table[table["method"] == "dense"]
    if len(dense):
        fig.add_hrect(y0=float(dense["return_lower"].iloc[0]), y1=float(dense["return_upper"].iloc[0]),
                      fillcolor="grey", opacity=0.15, line_width=0, annotation_text="dense fp32 interval",
                      annotation_position="top left")  # fmt: skip
    on_front = table[front].sort_values(cost)
    if len(on_front) > 1:
        fig.add_scatter(x=on_front[cost], y=on_front["return_iqm"], mode="lines", line=dict(dash="dash", shape="hv"),
                        name="Pareto front", hoverinfo="skip")  # fmt: skip
    for row, on in zip(table.itertuples(), front, strict=True):
        fig.add_scatter(
            x=[getattr(row, cost)], y=[row.return_iqm], mode="markers+text", text=[row.label],
            textposition="top center", name=f"{row.label} (n={row.n})",
            marker=dict(size=12 if on else 9, symbol="diamond" if on else "circle"),
            error_y=dict(type="data", symmetric=False, array=[row.return_upper - row.return_iqm],
                         arrayminus=[row.return_iqm - row.return_lower]),
            hovertemplate=f"{row.label}<br>{cost} %{{x:.3g}}<br>return IQM %{{y:.1f}}<extra></extra>",
        )  # fmt: skip
    for text, value in (reference or {}).items():
        fig.add_vline(x=value, line_dash="dot", annotation_text=text)
    env = table["env_id"].iloc[0] if len(table) else ""
    fig.update_layout(
        title=title or f"{env}: return (IQM, 95% interval over seeds) against {cost.replace('_', ' ')}",
        xaxis_title=axis_title, yaxis_title="evaluation return of the deployed actor", template=TEMPLATE,
        height=480,
    )  # fmt: skip
    fig.update_xaxes(type=axis_type)
    return fig
