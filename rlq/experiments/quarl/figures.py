"""Plotly figures of the QuaRL notebooks: PTQ, QAT, ActorQ and latency."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlq.experiments.figures import TEMPLATE

PRECISION_COLORS = {"fp32": "#636efa", "fp16": "#00cc96", "int8": "#ef553b"}
"""One color per actor precision, in every ActorQ figure."""


def ptq_bars_figure(summary: pd.DataFrame) -> go.Figure:
    """Return each run's mean return at fp32, fp16 and int8 (and ONNX int8 when evaluated), as grouped bars.

    ``summary`` is :func:`rlq.experiments.quarl.ptq_summary`'s table.
    """
    fig = go.Figure()
    for column in ["fp32", "fp16", "int8"] + (["onnx_int8"] if "onnx_int8" in summary.columns else []):
        fig.add_bar(x=summary["run"], y=summary[column], name=column.replace("_", " "))
    fig.update_layout(
        barmode="group",
        template=TEMPLATE,
        yaxis_title="mean return",
        title="Post-training quantization: the same agent at fp32, fp16 and int8",
    )
    return fig


def bit_sweep_figure(ptq: pd.DataFrame, tolerance: float) -> go.Figure:
    """Return each run's normalised score against weight bit width (1: fp32, 0: random), with the tolerance band.

    ``ptq`` is :func:`rlq.experiments.quarl.evaluate_ptq`'s table.
    """
    sweep = ptq[(ptq.backend == "torch") & ptq.precision.str.startswith("int")].sort_values("bits")
    fig = go.Figure()
    for run, group in sweep.groupby("run", sort=False):
        fig.add_scatter(
            x=group["bits"],
            y=group["normalised_score"],
            mode="lines+markers",
            name=run,
            customdata=group[["mean_return"]],
            hovertemplate="%{x} bits: return %{customdata[0]:.1f}",
        )
    fig.update_layout(
        template=TEMPLATE,
        xaxis_title="weight bits",
        yaxis_title="normalised score",
        title="Return against weight bit width (1 = fp32 agent, 0 = random policy)",
    )
    fig.add_hrect(y0=1 - tolerance, y1=1 + tolerance, fillcolor="green", opacity=0.1, line_width=0)
    fig.add_hline(y=1, line_dash="dash", annotation_text="fp32")
    fig.update_xaxes(autorange="reversed", dtick=2)
    return fig


def qat_vs_ptq_figure(summary: pd.DataFrame) -> go.Figure:
    """Return per run the mean return of QAT and PTQ against bit width (error bars: std over seeds), fp32 dashed.

    ``summary`` is :func:`rlq.experiments.quarl.qat_summary`'s table; one panel per run.
    """
    runs = list(summary["run"].unique())
    fig = make_subplots(rows=1, cols=len(runs), subplot_titles=[f"{run}: QAT against PTQ" for run in runs])
    for col, run in enumerate(runs, start=1):
        group = summary[summary["run"] == run]
        for method, label in (("ptq", "post-training quantization"), ("qat", "quantization-aware training")):
            part = group[group.method == method].sort_values("bits")
            fig.add_scatter(
                x=part["bits"],
                y=part["mean"],
                error_y=dict(array=part["std"]),
                mode="lines+markers",
                name=label,
                legendgroup=method,
                showlegend=col == 1,
                row=1,
                col=col,
            )
        fp32 = group.loc[group.method == "fp32", "mean"]
        if len(fp32):
            fig.add_hline(y=fp32.iloc[0], line_dash="dash", annotation_text="fp32", row=1, col=col)
    fig.update_xaxes(title_text="weight bits")
    fig.update_yaxes(title_text="mean return", col=1)
    fig.update_layout(template=TEMPLATE, height=420)
    return fig


def qat_curves_figure(
    curves: pd.DataFrame, specs: Sequence[Any], delay_fraction: float, seed: int, window: int = 10
) -> go.Figure:
    """Return the learning curves of one seed's fp32 and QAT agents, one panel per run, the quantization delay dotted.

    ``curves`` is :func:`rlq.experiments.quarl.qat_vs_ptq`'s second table and ``specs`` its runs
    (:class:`rlq.experiments.quarl.RunSpec`); each curve is a rolling mean of ``window`` episodes.
    """
    curves = curves[curves.seed == seed]
    runs = list(curves.groupby(["algorithm", "environment"], sort=False).groups)
    fig = make_subplots(rows=1, cols=max(1, len(runs)), subplot_titles=[f"{a} on {e}" for a, e in runs])
    for col, (algo, env_id) in enumerate(runs, start=1):
        group = curves[(curves.algorithm == algo) & (curves.environment == env_id)]
        for (method, bits), part in group.groupby(["method", "bits"], sort=False):
            smooth = part["episode_return"].rolling(window, min_periods=1).mean()
            fig.add_scatter(
                x=part["timestep"],
                y=smooth,
                mode="lines",
                name="fp32" if method == "fp32" else f"QAT {bits} bits",
                row=1,
                col=col,
            )
        steps = group["timestep"].max()
        fig.add_vline(
            x=delay_fraction * steps, line_dash="dot", annotation_text="quantization delay", row=1, col=col
        )
    fig.update_xaxes(title_text="environment steps")
    fig.update_yaxes(title_text=f"episode return (mean of last {window})", col=1)
    fig.update_layout(template=TEMPLATE, title=f"Learning curves, seed {seed}", height=420)
    return fig


def actorq_return_figure(curves: pd.DataFrame, return_threshold: float, title: str) -> go.Figure:
    """Return evaluation return against training wall-clock per actor precision, one panel per task, the threshold dotted.

    ``curves`` is :func:`rlq.experiments.quarl.actorq_curves`'s table.
    """
    tasks = list(curves["task"].unique())
    fig = make_subplots(rows=1, cols=len(tasks), subplot_titles=tasks)
    for col, task in enumerate(tasks, start=1):
        for precision, h in curves[curves["task"] == task].groupby("precision", sort=False):
            fig.add_scatter(
                x=h["wall_time_s"],
                y=h["eval_return"],
                mode="lines+markers",
                name=precision,
                legendgroup=precision,
                showlegend=col == 1,
                line=dict(color=PRECISION_COLORS.get(precision)),
                row=1,
                col=col,
            )
        fig.add_hline(y=return_threshold, line_dash="dot", line_color="grey", row=1, col=col)
    fig.update_xaxes(title_text="training wall-clock (s)")
    fig.update_yaxes(title_text="evaluation return", col=1)
    fig.update_layout(title=title, height=380)
    return fig


def actorq_breakdown_figure(actors: pd.DataFrame, paper: pd.DataFrame, learner: pd.DataFrame) -> go.Figure:
    """Return stacked bars: our actors' seconds per 1000 steps, the paper's actor seconds, our learner process's seconds.

    The three tables are :func:`rlq.experiments.quarl.actor_breakdown`, :func:`~rlq.experiments.quarl.paper_breakdown`
    and :func:`~rlq.experiments.quarl.learner_breakdown`.
    """
    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=[
            "ours: actor s per 1000 steps",
            "paper: actor s (period 30)",
            "ours: learner process s",
        ],
    )
    for part in actors["part"].unique():
        sub = actors[actors["part"] == part]
        fig.add_bar(
            x=sub["precision"], y=sub["seconds_per_1000_steps"], name=part, legendgroup=part, row=1, col=1
        )
        psub = paper[paper["part"] == part]
        if len(psub):
            fig.add_bar(
                x=psub["precision"],
                y=psub["value"],
                name=part,
                legendgroup=part,
                showlegend=False,
                row=1,
                col=2,
            )
    for part in learner["part"].unique():
        sub = learner[learner["part"] == part]
        fig.add_bar(x=sub["precision"], y=sub["seconds"], name=part, row=1, col=3)
    fig.update_layout(barmode="stack", title="Runtime breakdown", height=420)
    return fig


def actorq_throughput_figure(summary: pd.DataFrame) -> go.Figure:
    """Return bytes per broadcast (first task) and actor steps per second (mean over tasks) per precision.

    ``summary`` is :func:`rlq.experiments.quarl.actorq_summary`'s table.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=["bytes per broadcast", "actor steps per second"])
    first = summary[summary["task"] == summary["task"].iloc[0]]
    fig.add_bar(
        x=first["precision"],
        y=first["bytes_per_broadcast"],
        text=first["bytes_per_broadcast"],
        showlegend=False,
        row=1,
        col=1,
    )
    per_precision = summary.groupby("precision", sort=False)["actor_steps_per_s"].mean()
    fig.add_bar(
        x=per_precision.index,
        y=per_precision.values,
        text=[f"{v:.0f}" for v in per_precision.values],
        showlegend=False,
        row=1,
        col=2,
    )
    fig.update_layout(height=360)
    return fig


def latency_figure(latency: pd.DataFrame, threads: int) -> go.Figure:
    """Return the median latency of each network's action path per backend at the smallest batch (log scale).

    ``latency`` is :func:`rlq.experiments.quarl.benchmark_networks`'s first table.
    """
    batch = latency["batch_size"].min()
    fig = go.Figure()
    for backend, group in latency[latency.batch_size == batch].groupby("backend", sort=False):
        fig.add_bar(
            x=group["network"],
            y=group["median_us"],
            name=backend,
            customdata=group[["speedup_vs_torch_fp32"]],
            hovertemplate="%{y:.0f} us (%{customdata[0]:.2f}x torch fp32)",
        )
    fig.update_layout(
        barmode="group",
        template=TEMPLATE,
        yaxis_type="log",
        yaxis_title="median latency (us)",
        title=f"Action path latency at batch {batch}, {threads} thread(s)",
    )
    return fig


def sizes_figure(stored: pd.DataFrame) -> go.Figure:
    """Return each network's serialized weights per precision in KiB (log scale); ``stored`` is ``stored_sizes``'s table."""
    fig = go.Figure()
    for precision in stored.columns:
        fig.add_bar(x=stored.index, y=stored[precision] / 1024, name=precision)
    fig.update_layout(
        barmode="group",
        template=TEMPLATE,
        yaxis_type="log",
        yaxis_title="KiB",
        title="Serialized weights of each network at each precision",
    )
    return fig
