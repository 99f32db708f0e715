"""The sparsity tuner's figures, drawn afresh from its explored points and shown through ``ipywidgets.Output``.

Each figure is a plain ``plotly.graph_objects.Figure`` built from the tuner's state by a function of this
module, so the figure always shows every point the tuner holds, and the "current" star is the point the
status line names. :class:`FigureView` shows a figure as Plotly's mime bundle
(``application/vnd.plotly.v1+json``) in the ``outputs`` of an ``ipywidgets.Output``; the jupyterlab-plotly
extension renders it, loading plotly.js once per page.

Why not ``go.FigureWidget``: in Plotly 7 it is an anywidget whose ``_esm`` trait carries all of plotly.js
(about 5 MB per figure), and anywidget's frontend gives up on a model that has not initialised within 2 s.
On a page reload JupyterLab restores every widget at once, and on a busy machine four figures (about 20 MB
of ESM) can miss that deadline and come back as empty axes. An Output widget's ``outputs`` is plain JSON that
JupyterLab restores with the rest of the widget state, and it can be replaced from a worker thread.
"""

from __future__ import annotations

import json
import math
from typing import Any

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

PLOTLY_MIME = "application/vnd.plotly.v1+json"
BIT_TICKS = (1, 2, 3, 4, 6, 8, 16, 32)
"""Ticks of the bits-per-weight axis; 32 is dense fp32."""

REWARD_SIZE, LAYER_SIZE, SIZE_SIZE, TRAINING_SIZE = (740, 380), (520, 340), (440, 340), (960, 340)
"""Width and height in pixels of each figure (fixed, so the layout does not move as the figures change)."""

_MARGIN = dict(l=60, r=20, t=50, b=50)


def _base(title: str, size: tuple[int, int], **layout: Any) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(
        title=title, template="plotly_white", width=size[0], height=size[1], margin=_MARGIN, **layout
    )
    return fig


METHOD_COLOURS = {"none": "#555555", "block_circulant": "#1f77b4", "pruning": "#ff7f0e", "gst": "#2ca02c"}
"""Marker colour of each compression method in the return figure (the star is crimson)."""
BIT_SYMBOLS = {
    32: "circle",
    16: "square",
    8: "diamond",
    6: "triangle-up",
    4: "triangle-down",
    3: "cross",
    2: "x",
}
"""Marker symbol of each weight precision in the return figure."""
CURRENT = "current"
"""Name of the return figure's star trace (the point the status line names)."""


def explored_traces(fig: go.Figure) -> list[Any]:
    """Return the return figure's traces of explored points: every trace but the star."""
    return [trace for trace in fig.data if trace.name != CURRENT]


def reward_figure(points: list[dict[str, Any]], current: int | None) -> go.Figure:
    """Return the mean return of every explored point over its bits per weight, the current one starred.

    One trace per method and precision: the colour is the method (:data:`METHOD_COLOURS`), the symbol the
    weight precision (:data:`BIT_SYMBOLS`); the star is the trace named :data:`CURRENT`, drawn last.
    """
    fig = _base(
        "Return vs bits per weight (every explored setting)",
        REWARD_SIZE,
        yaxis_title="mean return",
        legend=dict(orientation="h", y=-0.2, x=0),
    )
    bits = [p["bits_per_weight"] for p in points]
    low = min([*bits, 1.0])
    fig.update_xaxes(
        type="log",
        title="bits per weight (log; 32 is dense fp32)",
        range=[math.log10(low * 0.8), math.log10(40)],
        tickvals=list(BIT_TICKS),
        ticktext=[f"{b} dense" if b == 32 else str(b) for b in BIT_TICKS],
    )
    hover = (
        "%{customdata[0]}<br>return %{y:.1f}<br>%{x:.2f} bits per weight<br>"
        "compression ratio %{customdata[1]:.1%}<br>%{customdata[2]:.2f} KiB stored<extra></extra>"
    )
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for point in points:
        groups.setdefault((point["method"], point["bits"]), []).append(point)
    for (method, width), group in groups.items():
        fig.add_scatter(
            x=[p["bits_per_weight"] for p in group],
            y=[p["mean_return"] for p in group],
            mode="markers",
            name=f"{method}, {width} bit",
            marker=dict(
                size=10, opacity=0.85, color=METHOD_COLOURS.get(method, "black"),
                symbol=BIT_SYMBOLS.get(width, "circle"), line=dict(width=1, color="white"),
            ),
            customdata=[[p["label"], p["compression_ratio"], p["stored_bytes"] / 1024] for p in group],
            hovertemplate=hover,
        )  # fmt: skip
    star = [points[current]] if current is not None else []
    fig.add_scatter(
        x=[p["bits_per_weight"] for p in star],
        y=[p["mean_return"] for p in star],
        mode="markers",
        name=CURRENT,
        marker=dict(size=18, symbol="star", color="crimson", line=dict(width=1, color="black")),
        customdata=[[p["label"], p["compression_ratio"], p["stored_bytes"] / 1024] for p in star],
        hovertemplate=hover,
    )
    return fig


def layer_figure(point: dict[str, Any] | None) -> go.Figure:
    """Return the current point's compression of each layer (1 - stored / dense)."""
    fig = _base("Per-layer compression (1 - stored / dense)", LAYER_SIZE, yaxis_range=[0, 1])
    rows = point["layers"] if point is not None else []
    fig.add_bar(x=[row["name"] for row in rows], y=[row["ratio"] for row in rows], name="compression")
    fig.update_xaxes(tickangle=30, tickfont=dict(size=9))
    return fig


def log_ticks(low: float, high: float) -> list[float]:
    """Return 1, 2 and 5 times each power of ten within ``[low, high]``: a log axis's labels, one size each
    (Plotly's own labels a short log axis at 2 to 9 of every decade as well, in small type)."""
    ticks = []
    for power in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1):
        ticks += [m * 10.0**power for m in (1, 2, 5) if low <= m * 10.0**power <= high]
    return ticks


def size_figure(point: dict[str, Any] | None) -> go.Figure:
    """Return the weights' stored size of the current point beside dense fp32, in KiB on a log axis."""
    fig = _base("Weights stored (KiB, log)", SIZE_SIZE, showlegend=False)
    if point is None:
        return fig
    sizes = [point["dense_bytes"] / 1024, point["stored_bytes"] / 1024]
    bits = [32.0, point["bits_per_weight"]]
    fig.add_bar(
        x=["dense fp32", "current"],
        y=sizes,
        text=[f"{s:.2f} KiB<br>{b:.2f} bits/weight" for s, b in zip(sizes, bits, strict=True)],
        textposition="outside",
        marker_color=["lightgray", "crimson"],
    )
    top = math.log10(max(sizes) * 4)
    bottom = math.log10(max(min(sizes) / 4, 1e-3))
    ticks = log_ticks(10**bottom, 10**top)
    fig.update_yaxes(
        type="log", range=[bottom, top], title="KiB", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks]
    )
    return fig


COMPRESSION_TICKS = (0.0, 0.25, 0.5, 0.75, 1.0)
"""Ticks of the learning-curve figure's compression axis (its own, not aligned to the return axis's grid)."""


def training_figure(
    reference: pd.DataFrame | None,
    returns: list[tuple[int, float]],
    compression: list[tuple[int, float]],
    label: str,
    final: tuple[int, float, int] | None = None,
) -> go.Figure:
    """Return the episode returns of "train with these settings" beside the dense reference's learning curve.

    ``returns`` and the reference are training episodes (exploration included); ``final``, when given, is
    ``(step, mean return, episodes)`` of the trained policy's own evaluation, drawn as one marker. The
    reference is dashed and drawn over this run's line: both start with the same seeded random warm-up,
    where their curves coincide. The legend names every line before training starts: a line without points
    yet holds one empty point (plotly.js lists no trace of length 0).
    """
    fig = _base(
        "Learning curve: train with these settings, beside the dense agent's",
        TRAINING_SIZE,
        xaxis_title="environment steps",
        yaxis_title="episode return",
        yaxis2=dict(
            title="compression ratio", overlaying="y", side="right", range=[0, 1], showgrid=False,
            tickmode="array", tickvals=list(COMPRESSION_TICKS), tickformat=".0%",
        ),
        legend=dict(orientation="h", y=-0.25, x=0), showlegend=True,
    )  # fmt: skip
    fig.add_scatter(
        x=[s for s, _ in returns] or [None],
        y=[r for _, r in returns] or [None],
        mode="lines+markers",
        name=f"this run, training episodes: {label}"
        if label
        else "this run (press 'train with these settings')",
        line=dict(color="crimson"),
    )
    if reference is not None and len(reference):
        fig.add_scatter(
            x=list(reference["timestep"]),
            y=list(reference["episode_return"]),
            mode="lines",
            name="dense reference, training episodes (the tuned agent's)",
            line=dict(color="dimgray", dash="dash", width=2),
        )
    if final is not None:
        step, mean_return, episodes = final
        fig.add_scatter(
            x=[step],
            y=[mean_return],
            mode="markers",
            name=f"this run's final policy, evaluated ({episodes} seeded episodes)",
            marker=dict(size=14, symbol="diamond", color="crimson", line=dict(width=1, color="black")),
        )
    fig.add_scatter(
        x=[s for s, _ in compression] or [None],
        y=[c for _, c in compression] or [None],
        mode="lines",
        name="compression ratio (right axis)",
        yaxis="y2",
        line=dict(color="royalblue", dash="dot"),
    )
    return fig


def plotly_output(fig: go.Figure) -> dict[str, Any]:
    """Return ``fig`` as one Jupyter ``display_data`` output holding Plotly's mime bundle (plain JSON)."""
    spec = json.loads(pio.to_json(fig, validate=False))
    spec["config"] = {"displaylogo": False, "responsive": False}
    title = fig.layout.title.text or "figure"
    return {"output_type": "display_data", "data": {PLOTLY_MIME: spec, "text/plain": title}, "metadata": {}}


class FigureView:
    """One Plotly figure shown in a fixed-size ``ipywidgets.Output``; :meth:`show` replaces it whole."""

    def __init__(self, size: tuple[int, int]):
        self.figure: go.Figure | None = None
        self.output = widgets.Output(
            layout=widgets.Layout(width=f"{size[0] + 10}px", height=f"{size[1] + 10}px")
        )

    def show(self, fig: go.Figure) -> None:
        """Show ``fig`` in place of the previous figure (safe from a worker thread)."""
        self.figure = fig
        self.output.outputs = (plotly_output(fig),)
