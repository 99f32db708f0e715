"""Plotly figures of the GST notebooks: compression and reward over training, methods beside the paper, the sweep."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlq.analysis.shared_figures import TEMPLATE

METHOD_COLORS = {"dense": "#636efa", "pruning": "#ef553b", "gst": "#00cc96"}
VARIANT_COLORS = ("#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff", "#fecb52")
"""Colors of methods beyond METHOD_COLORS (GST variants such as gst_bc_only), picked by name."""


def method_color(method: str) -> str:
    """Return the method's color: METHOD_COLORS', else one of VARIANT_COLORS chosen by the name (stable across runs)."""
    return METHOD_COLORS.get(method) or VARIANT_COLORS[sum(map(ord, str(method))) % len(VARIANT_COLORS)]


def compression_figure(
    history: pd.DataFrame,
    *,
    title: str = "Compression ratio over training",
    facet_col: str | None = None,
    paper_average: float | None = None,
    x_label: str = "environment steps",
) -> go.Figure:
    """Return each run's compression ratio over training: one color and one legend entry per method, a line per seed.

    ``paper_average`` draws the paper's average compression of GST as a dashed line.
    """
    fig = px.line(
        history,
        x="step",
        y="compression_ratio",
        color="method",
        line_group="seed" if "seed" in history.columns else None,  # 10 seeds stay one legend entry per method
        facet_col=facet_col,
        line_shape="hv",
        title=title,
        template=TEMPLATE,
        color_discrete_map=METHOD_COLORS,
        labels={"step": x_label, "compression_ratio": "compression ratio"},
    )
    if paper_average is not None:
        fig.add_hline(y=paper_average, line_dash="dash", annotation_text="paper: GST average")
    return fig


def training_return_figure(
    curve: pd.DataFrame,
    *,
    window: int,
    title: str = "Training reward",
    facet_col: str | None = None,
    x_label: str = "environment steps",
    y_label: str | None = None,
) -> go.Figure:
    """Return each run's training episode returns over training (a rolling mean of ``window`` episodes): one color
    and one legend entry per method, a line per seed."""
    y_label = y_label or f"return (mean of {window} episodes)"
    runs = [c for c in ("env_id", "seed", "method") if c in curve.columns]
    smooth = curve.sort_values("timestep").copy()
    smooth[y_label] = smooth.groupby(runs)["episode_return"].transform(
        lambda r: r.rolling(window, min_periods=1).mean()
    )
    fig = px.line(
        smooth,
        x="timestep",
        y=y_label,
        color="method",
        line_group="seed",
        facet_col=facet_col,
        title=title,
        template=TEMPLATE,
        color_discrete_map=METHOD_COLORS,
        labels={"timestep": x_label},
        facet_col_spacing=0.08,
    )
    if facet_col is not None:  # tasks have their own return scales
        fig.update_yaxes(matches=None, showticklabels=True)
    return fig


def method_bars_figure(
    means: pd.DataFrame, *, score: str, score_title: str, paper_average: float | None = None
) -> go.Figure:
    """Return each method's average compression (beside the paper's for GST) as bars and its ``score`` as dots.

    ``means`` is :func:`rlq.analysis.gst.method_means`'s table, one row per method.
    """
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("Average compression ratio over training", score_title)
    )
    colors = [method_color(m) for m in means.index]
    fig.add_bar(
        x=means.index, y=means["avg_compression_ratio"], name="ours", marker_color=colors, row=1, col=1
    )
    if paper_average is not None:
        fig.add_bar(x=["gst (paper)"], y=[paper_average], name="paper", marker_color="grey", row=1, col=1)
    fig.add_scatter(  # a return can be negative: a dot, not a bar from 0
        x=means.index,
        y=means[score],
        name=score,
        mode="markers",
        marker=dict(color=colors, size=12),
        showlegend=False,
        row=1,
        col=2,
    )
    fig.update_layout(template=TEMPLATE, height=420)
    return fig


def gst_schedule_figure(
    history: pd.DataFrame, group_keys: Sequence[str], *, reward_title: str = "episode return"
) -> go.Figure:
    """Return one GST run's target sparsity, compression ratio and windowed reward over training.

    The run is the first GST run of ``history`` (its ``group_keys`` values name it); crosses mark pruning
    updates where the reward had dropped (a back-off, then a pause). The target exists from the first
    pruning update on: before it, the shaded block-circulant phase has none.
    """
    from rlq.analysis.gst.tables import gst_rows

    gst = gst_rows(history)
    key = gst[list(group_keys)].iloc[0].tolist() if len(gst) else None
    one = gst[(gst[list(group_keys)] == key).all(axis=1)] if key else gst
    sets_target = {"prune", "hold", "hand_over"}  # GSTCallback's events that set or keep a target
    updates = one["event"].astype(str).str.split("+").map(lambda kinds: bool(sets_target & set(kinds)))
    first_update = one.loc[updates, "step"].min() if updates.any() else None
    targeted = one.iloc[:0] if first_update is None else one[one["step"] >= first_update]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_scatter(x=one["step"], y=one["compression_ratio"], name="compression ratio", line_shape="hv")
    fig.add_scatter(
        x=targeted["step"],
        y=targeted["target_sparsity"],
        name="target sparsity",
        line_shape="hv",
        line_dash="dash",
    )
    fig.add_scatter(
        x=one["step"],
        y=one["mean_reward"],
        name="training reward (windowed)",
        secondary_y=True,
        line_dash="dot",
    )
    drops = one[one["decision"].isin(["backoff", "cooldown"]) & (one["event"] != "log")]
    fig.add_scatter(
        x=drops["step"],
        y=drops["target_sparsity"],
        mode="markers",
        name="back-off / pause",
        marker=dict(size=9, symbol="x"),
    )
    if len(one):  # after the traces: a shape goes only on subplots that hold one
        fig.add_vrect(
            x0=one["step"].min(),
            x1=one["step"].max() if first_update is None else first_update,
            fillcolor="grey",
            opacity=0.12,
            line_width=0,
            annotation_text="block-circulant, no target yet",
            annotation_position="top left",
        )
    label = ", ".join(f"{k} {v}" for k, v in zip(group_keys, key or [], strict=False))
    fig.update_layout(
        title=f"GST schedule and reward over training ({label})",
        template=TEMPLATE,
        xaxis_title="environment steps",
    )
    fig.update_yaxes(title_text="ratio", range=[0, 1.02], secondary_y=False)  # compression is a fraction
    fig.update_yaxes(title_text=reward_title, secondary_y=True)
    return fig


REWARD_TRACE = [10.0 + i for i in range(15)] + [8.0] * 8 + [26.0 + i for i in range(12)]
"""A scripted stream of episode returns: rising for 15 episodes, dropped for 8, then back above its best for 12."""


def reward_aware_demo_figure(sparsity: dict[str, Any], max_sparsity: float = 0.9) -> go.Figure:
    """Return GST's reward-aware target fed :data:`REWARD_TRACE`, one episode and one update per point.

    ``sparsity`` holds :class:`rlq.compress.RewardAwareConfig` fields (a notebook's ``settings["gst"]["sparsity"]``);
    the cap is ``max_sparsity``, so the rise, the back-off and the pause all show.
    """
    from rlq.compress import RewardAwareConfig, RewardAwareSparsity

    controller = RewardAwareSparsity(RewardAwareConfig(**{**sparsity, "max_sparsity": max_sparsity}))
    targets = []
    for score in REWARD_TRACE:
        controller.add_scores([score])
        targets.append(controller.update())
    updates = list(range(len(REWARD_TRACE)))
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_scatter(x=updates, y=targets, name="target sparsity", line_shape="hv")
    fig.add_scatter(
        x=updates, y=REWARD_TRACE, name="scripted episode return", secondary_y=True, line_dash="dot"
    )
    fig.update_layout(
        title="Reward-aware target on scripted episode returns", template=TEMPLATE, xaxis_title="episode"
    )
    fig.update_yaxes(title_text="target sparsity", secondary_y=False)
    fig.update_yaxes(title_text="reward", secondary_y=True)
    return fig


def sweep_figure(table: pd.DataFrame, dense_return: float | None = None) -> go.Figure:
    """Return average compression and evaluation return against S_shift, one line per transition method.

    ``table`` is :func:`rlq.analysis.gst.sweep_table`'s; ``dense_return`` draws the dense run's return.
    """
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("Average compression ratio", "Final evaluation return")
    )
    for transition, rows in table.groupby(level=0):
        shifts = rows.index.get_level_values(1)
        style = dict(name=transition, legendgroup=transition)
        fig.add_scatter(x=shifts, y=rows["avg_compression_ratio"], row=1, col=1, **style)
        fig.add_scatter(x=shifts, y=rows["eval_return"], showlegend=False, row=1, col=2, **style)
    if dense_return is not None:
        fig.add_hline(y=dense_return, line_dash="dot", annotation_text="dense", row=1, col=2)
    fig.update_xaxes(title_text="S_shift")
    fig.update_layout(template=TEMPLATE, height=420)
    return fig


def sweep_compression_figure(history: pd.DataFrame) -> go.Figure:
    """Return the GST runs' compression ratio over training, one color per S_shift, one panel per transition."""
    return px.line(
        history[history["method"] == "gst"],
        x="step",
        y="compression_ratio",
        color="s_shift",
        line_dash="transition",
        facet_col="transition",
        line_shape="hv",
        template=TEMPLATE,
        title="Compression ratio over training",
        labels={"step": "environment steps"},
    )
