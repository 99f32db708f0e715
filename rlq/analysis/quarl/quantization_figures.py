"""Plotly figures of the QuaRL notebooks that `rlq report` also draws from committed tables: PTQ, QAT and ActorQ."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlq.analysis.shared_figures import TEMPLATE

PRECISION_COLORS = {"fp32": "#636efa", "fp16": "#00cc96", "int8": "#ef553b"}
"""One color per actor precision, in every ActorQ figure."""


def ptq_bars_figure(summary: pd.DataFrame) -> go.Figure:
    """Return each agent's mean return at fp32, fp16, int8 kernels, weights-only int8 (and ONNX int8), as grouped bars.

    ``summary`` is :func:`rlq.analysis.quarl.ptq_summary`'s table: one group per run and seed, an
    unsolved agent marked as such.
    """
    columns = ["fp32", "fp16", "int8", "int8_weights_only"] + (
        ["onnx_int8"] if "onnx_int8" in summary.columns else []
    )
    names = {"int8": "int8 kernels", "int8_weights_only": "int8 weights-only", "onnx_int8": "ONNX int8"}
    agents = [f"{r.run} s{r.seed}" + ("" if r.solved else " (not solved)") for r in summary.itertuples()]
    fig = go.Figure()
    for column in columns:
        fig.add_bar(x=agents, y=summary[column], name=names.get(column, column))
    fig.update_layout(
        barmode="group",
        template=TEMPLATE,
        yaxis_title="mean return",
        title="Post-training quantization: the same agent at fp32, fp16 and int8",
    )
    return fig


def bit_sweep_figure(ptq: pd.DataFrame, tolerance: float) -> go.Figure:
    """Return per run the normalised score against weight bits (1: fp32, 0: random): weights-only per seed, noise draws, kernel int8.

    ``ptq`` is the ``quarl_ptq`` notebook's evaluation table (``ptq.csv``); one panel per run. Lines: the weights-only
    sweep of each seed (8 bits simulated like the rest); grey dots: the matched noise control's draws (fp32
    weights plus uniform noise of half a step at that width); red diamonds: int8 with real kernels, which
    quantize activations too, drawn beside the weights-only 8-bit point, not on its line. Unsolved agents
    are dashed. The band is the tolerance around fp32.
    """
    from rlq.sb3.quantized import KERNEL, NOISE, WEIGHTS_ONLY

    torch_rows = ptq[ptq.backend == "torch"]
    runs = list(torch_rows["run"].unique())
    fig = make_subplots(rows=1, cols=len(runs), subplot_titles=runs, shared_yaxes=True)
    legend: set[str] = set()

    def show(name: str) -> bool:
        first = name not in legend
        legend.add(name)
        return first

    for col, run in enumerate(runs, start=1):
        rows = torch_rows[torch_rows.run == run]
        for seed, agent in rows.groupby("seed", sort=True):
            sweep = agent[agent.scheme == WEIGHTS_ONLY].sort_values("bits")
            solved = bool(agent["solved"].iloc[0])
            fig.add_scatter(
                x=sweep["bits"],
                y=sweep["normalised_score"],
                mode="lines+markers",
                name=f"weights-only, seed {seed}" + ("" if solved else " (not solved)"),
                line=dict(dash="solid" if solved else "dash"),
                customdata=sweep[["mean_return"]],
                hovertemplate="%{x} bits: return %{customdata[0]:.1f}",
                row=1,
                col=col,
            )
        noise = rows[rows.scheme == NOISE]
        if len(noise):
            fig.add_scatter(
                x=noise["bits"] + 0.25 * (noise["draw"] / max(1, noise["draw"].max()) - 0.5),
                y=noise["normalised_score"],
                mode="markers",
                marker=dict(color="grey", size=6, opacity=0.6),
                name="noise control (± half a step), one dot per draw",
                legendgroup="noise",
                showlegend=show("noise"),
                row=1,
                col=col,
            )
        kernel = rows[rows.scheme == KERNEL]
        fig.add_scatter(
            x=kernel["bits"] - 0.35,
            y=kernel["normalised_score"],
            mode="markers",
            marker=dict(color="#ef553b", size=10, symbol="diamond"),
            name="int8 kernels (weights + activations)",
            legendgroup="kernel",
            showlegend=show("kernel"),
            row=1,
            col=col,
        )
    fig.add_hrect(y0=1 - tolerance, y1=1 + tolerance, fillcolor="green", opacity=0.1, line_width=0)
    fig.add_hline(y=1, line_dash="dash")
    fig.update_xaxes(autorange="reversed", dtick=2, title_text="weight bits")
    fig.update_yaxes(title_text="normalised score (1 = fp32, 0 = random)", col=1)
    fig.update_layout(
        template=TEMPLATE, height=450, title="Return against weight bit width, beside the noise control"
    )
    return fig


def qat_vs_ptq_figure(summary: pd.DataFrame) -> go.Figure:
    """Return per run the mean return of QAT and PTQ against bit width (error bars: std over seeds), fp32 dashed.

    ``summary`` is :func:`rlq.analysis.quarl.qat_summary`'s table; one panel per run.
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


def regime_figure(
    comparison: pd.DataFrame, estimates: pd.DataFrame, target: float = 1.5, target_label: str | None = None
) -> go.Figure:
    """Return per regime the measured speedup of each seed, its IQM with 95% interval, and the predicted speedup.

    ``comparison`` and ``estimates`` are :func:`rlq.analysis.quarl.regime_comparison` and
    :func:`~rlq.analysis.quarl.regime_estimates`; the dotted line is ``target``, labelled ``target_label``
    (default: the paper's lower end).
    """
    fig = go.Figure()
    styles = {
        "measured_speedup": ("measured (steps/s)", "#ef553b", "circle"),
        "time_speedup": ("measured (time to threshold)", "#ab63fa", "square"),
        "predicted_speedup": ("predicted by the cost model", "#636efa", "diamond"),
    }
    for measure, (label, color, symbol) in styles.items():
        est = estimates[estimates["measure"] == measure]
        if est.empty:
            continue
        fig.add_scatter(
            x=est["regime"], y=est["value"], mode="markers", name=f"{label}: IQM, 95% interval",
            marker=dict(color=color, symbol=symbol, size=12), offsetgroup=measure,
            error_y=dict(type="data", symmetric=False, array=est["upper"] - est["value"],
                         arrayminus=est["value"] - est["lower"]),
        )  # fmt: skip
        seeds = comparison[["regime", measure]].dropna()
        fig.add_scatter(
            x=seeds["regime"], y=seeds[measure], mode="markers", name=f"{label}: seeds", offsetgroup=measure,
            marker=dict(color=color, symbol=symbol, size=6, opacity=0.45), showlegend=False,
        )  # fmt: skip
    fig.add_hline(y=1.0, line_color="grey")
    fig.add_hline(
        y=target,
        line_dash="dot",
        line_color="grey",
        annotation_text=target_label or f"paper's lower end {target}x",
    )
    fig.update_layout(
        template=TEMPLATE, scattermode="group", yaxis_title="int8 over fp32 actors (x)", height=420,
        title="End-to-end speedup of int8 actors per regime: measured beside predicted",
    )  # fmt: skip
    return fig


def engine_breakdown_figure(breakdown: pd.DataFrame, title: str) -> go.Figure:
    """Return the actors' milliseconds per environment step by part, stacked per precision, one panel per regime.

    ``breakdown`` is :func:`rlq.analysis.quarl.regime_breakdown`'s table; hovering a bar names its engine.
    """
    regimes = list(dict.fromkeys(breakdown["regime"]))
    fig = make_subplots(rows=1, cols=len(regimes), subplot_titles=regimes)
    colors = dict(
        zip(dict.fromkeys(breakdown["part"]), ("#ef553b", "#636efa", "#00cc96", "#ab63fa"), strict=False)
    )
    for col, regime in enumerate(regimes, start=1):
        rows = breakdown[breakdown["regime"] == regime]
        for part, color in colors.items():
            bars = rows[rows["part"] == part]
            fig.add_bar(x=bars["precision"] + " (" + bars["engine"] + ")", y=bars["ms_per_step"], name=part,
                        marker_color=color, legendgroup=part, showlegend=col == 1, row=1, col=col)  # fmt: skip
        fig.update_yaxes(title_text="actor ms per environment step" if col == 1 else None, row=1, col=col)
    fig.update_layout(template=TEMPLATE, barmode="stack", height=420, title=title)
    return fig


def speedup_curve_figure(curve: pd.DataFrame, paper_range: tuple[float, float] = (1.5, 2.5)) -> go.Figure:
    """Return the predicted speedup at the paper's setting against how much faster the learner is than this CPU's.

    ``curve`` is :func:`rlq.analysis.quarl.paper_setting_curve`'s table; the band is the paper's range. A
    ``measured`` column, where present, is drawn as points (e.g. a GPU learner's measured factor and speedup).
    """
    fig = go.Figure()
    fig.add_hrect(y0=paper_range[0], y1=paper_range[1], fillcolor="green", opacity=0.1, line_width=0,
                  annotation_text="paper: 1.5-2.5x")  # fmt: skip
    text = [
        f"fp32: {a} bound, int8: {b} bound"
        for a, b in zip(curve["bound_fp32"], curve["bound_q"], strict=True)
    ]
    fig.add_scatter(x=curve["learner_factor"], y=curve["speedup"], mode="lines+markers", name="predicted",
                    text=text, hovertemplate="N=%{x}: %{y:.2f}x<br>%{text}")  # fmt: skip
    if "measured" in curve.columns and curve["measured"].notna().any():
        pts = curve[curve["measured"].notna()]
        fig.add_scatter(x=pts["learner_factor"], y=pts["measured"], mode="markers", name="measured",
                        marker=dict(size=12, symbol="star"))  # fmt: skip
    fig.update_xaxes(type="log", title_text="learner N times faster than this CPU's (1 core)")
    fig.update_layout(
        template=TEMPLATE, yaxis_title="predicted end-to-end speedup, int8 over fp32 actors (x)", height=400,
        title="The paper's setting (4 actors, 2048x3, batch 256, 32 samples per insert), predicted",
    )  # fmt: skip
    return fig


def convergence_figure(
    by_steps: pd.DataFrame, by_time: pd.DataFrame, thresholds: dict[str, float]
) -> go.Figure:
    """Return the return's IQM and 95% band over seeds against environment steps (left) and wall time (right).

    One row per task; ``by_steps`` and ``by_time`` are :func:`rlq.analysis.quarl.return_at` tables, and
    ``thresholds`` each task's return threshold (dotted).
    """
    tasks = list(by_steps["task"].unique())
    titles = [
        f"{task}: {what}" for task in tasks for what in ("return at equal env steps", "at equal wall time")
    ]
    fig = make_subplots(rows=len(tasks), cols=2, subplot_titles=titles, vertical_spacing=0.2)
    for row, task in enumerate(tasks, start=1):
        for col, (table, x) in enumerate(((by_steps, "env_steps"), (by_time, "wall_time_s")), start=1):
            for precision, g in table[table["task"] == task].groupby("precision", sort=False):
                color = PRECISION_COLORS.get(precision)
                fig.add_scatter(x=list(g[x]) + list(g[x])[::-1], y=list(g["upper"]) + list(g["lower"])[::-1],
                                fill="toself", line=dict(width=0), fillcolor=color, opacity=0.2, hoverinfo="skip",
                                showlegend=False, legendgroup=precision, row=row, col=col)  # fmt: skip
                fig.add_scatter(x=g[x], y=g["value"], mode="lines+markers", name=precision, legendgroup=precision,
                                showlegend=row == 1 and col == 1, line=dict(color=color), row=row, col=col)  # fmt: skip
            if task in thresholds:
                fig.add_hline(y=thresholds[task], line_dash="dot", line_color="grey", row=row, col=col)
        fig.update_xaxes(title_text="environment steps", row=row, col=1)
        fig.update_xaxes(title_text="training wall-clock (s)", row=row, col=2)
        fig.update_yaxes(title_text="evaluation return (IQM)", row=row, col=1)
    fig.update_layout(height=320 * len(tasks), title="fp32 and int8 actors: IQM and 95% interval over seeds")
    return fig
