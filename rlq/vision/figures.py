"""Plotly figures of a classification comparison: accuracy and compression over training, per method."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

METHOD_COLORS = {"dense": "#636efa", "pruning": "#ef553b", "gst": "#00cc96"}


def training_figure(history: pd.DataFrame, title: str = "") -> go.Figure:
    """Return test accuracy (left) and compression ratio (right, solid; its running average dotted) per epoch.

    ``history`` has the columns of :func:`rlq.vision.train_classifier`'s history, several methods stacked.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=("test accuracy (%)", "compression ratio (%)"))
    for method, frame in history.groupby("method", sort=False):
        line = dict(color=METHOD_COLORS.get(method))
        fig.add_scatter(
            x=frame["epoch"], y=100 * frame["test_accuracy"], name=method, line=line, row=1, col=1
        )
        fig.add_scatter(
            x=frame["epoch"],
            y=100 * frame["compression_ratio"],
            name=method,
            showlegend=False,
            line=line,
            row=1,
            col=2,
        )
        fig.add_scatter(
            x=frame["epoch"],
            y=100 * frame["avg_compression_ratio"],
            name=f"{method}, average so far",
            line={**line, "dash": "dot"},
            row=1,
            col=2,
        )
    fig.update_xaxes(title_text="epoch")
    fig.update_layout(title=title, template="plotly_white", height=420)
    return fig
