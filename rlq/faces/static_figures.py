"""Static PNGs of each committed run's headline figures, for a reader who browses the repository without running it.

``rlq report --figures`` builds every committed run's figures (``data/results/<experiment>/<preset>/``, a
folder with a ``results.json``) from its committed CSVs with the notebooks' own figure builders
(:data:`FIGURES`) and writes them beside the CSVs as ``<name>.png``; docs/results.md embeds them. It also
writes the report's forest plot per claim family, on the committed results alone (the verdicts of the
README's table), to ``docs/figures/claims_<family>.png`` for docs/claims.md. Rendering uses Plotly's
static export: the ``kaleido`` package and a Chromium browser on the machine (``apt install chromium``).
"""

from __future__ import annotations

import io
import re
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from rlq.core.jsonio import read_json
from rlq.experiments.paths import data_dir
from rlq.experiments.results import normalize_method_names
from rlq.experiments.run_folders import PARAMS_FILE, RESULTS_FILE

WIDTH, HEIGHT, SCALE = 900, 450, 1
"""Every committed run's PNG: 900x450 pixels at scale 1 (10-50 KB each with a palette)."""

Figures = list[tuple[str, go.Figure]]


class FigureError(ValueError):
    """A committed run's figure could not be built from its tables or rendered."""


@dataclass
class Committed:
    """One committed run's folder: its tables, parameters and numbers, as the figure builders read them."""

    experiment: str
    preset: str
    folder: Path
    loaded: list[str] = field(default_factory=list)

    def has(self, table: str) -> bool:
        """Return whether the run committed ``<table>.csv``."""
        return (self.folder / f"{table}.csv").is_file()

    def table(self, table: str) -> pd.DataFrame:
        """Return the committed ``<table>.csv`` (method names as today); FigureError when it is missing."""
        self.loaded.append(table)
        if not self.has(table):
            raise FigureError(f"{self.experiment}/{self.preset}: no committed table {table}.csv")
        return normalize_method_names(pd.read_csv(self.folder / f"{table}.csv"))

    @cached_property
    def params(self) -> dict[str, Any]:
        """Return the run's ``params.json``."""
        return normalize_method_names(read_json(self.folder / PARAMS_FILE))

    @cached_property
    def results(self) -> dict[str, Any]:
        """Return the run's ``results.json``."""
        return normalize_method_names(read_json(self.folder / RESULTS_FILE))

    @property
    def label(self) -> str:
        """Return ``experiment preset (task)``, the start of every figure's title."""
        p = self.params
        task = p.get("env_ids") or p.get("env_id") or p.get("scenario")
        task = ", ".join(task) if isinstance(task, list) else task
        return f"{self.experiment} {self.preset}" + (f" ({task})" if task else "")


GST_PAPER_EXPERIMENT = {"gst_a2c_atari": "a2c_atari", "gst_ppo_football": "ppo_football"}
"""GST experiments whose paper states one average compression of GST, drawn as a dashed line."""
GST_X_LABEL = {"gst_a2c_atari": "agent steps (4 frames each)"}


def _gst_run(run: Committed) -> Figures:
    """GST on RL: compression over training (history.csv) and the training return (curve.csv, when committed)."""
    from rlq.analysis.gst.compression_figures import compression_figure, training_return_figure
    from rlq.experiments.paper import paper_value

    x_label = GST_X_LABEL.get(run.experiment, "environment steps")
    paper = GST_PAPER_EXPERIMENT.get(run.experiment)
    average = paper_value("gst", "avg_compression_ratio", experiment=paper) / 100 if paper else None
    figures = [
        (
            "compression",
            compression_figure(
                run.table("history"),
                title=f"{run.label}: compression ratio over training",
                paper_average=average,
                x_label=x_label,
            ),
        )
    ]
    if run.has("curve"):
        window = int(run.params.get("reward_window") or 10)
        curve = training_return_figure(
            run.table("curve"), window=window, title=f"{run.label}: training return", x_label=x_label
        )
        figures.append(("training_return", curve))
    return figures


def _baseline(run: Committed) -> Figures:
    """The dense fp32 reference: its learning curve beside a random policy's return."""
    from rlq.analysis.shared_figures import learning_curve_figure

    r = run.results
    title = (
        f"{run.label}: {run.params.get('algorithm', '')}, {r['timesteps']} steps "
        f"(final return {r['final_mean_return']:.0f} vs random {r['random_mean_return']:.0f})"
    )
    reference = {"random policy": r["random_mean_return"], "final evaluation": r["final_mean_return"]}
    return [("learning_curve", learning_curve_figure(run.table("curve"), title=title, reference=reference))]


def _sweep(run: Committed) -> Figures:
    """The S_shift sweep: compression and return per configuration, then GST's compression over training."""
    from rlq.analysis.gst import sweep_numbers, sweep_table
    from rlq.analysis.gst.compression_figures import sweep_compression_figure, sweep_figure

    summary = run.table("summary")
    table = sweep_table(summary)
    dense = sweep_numbers(table, summary, run.table("events"))["dense_eval_return"]
    compression = sweep_compression_figure(run.table("history"))
    compression.update_layout(title=f"{run.label}: compression ratio over training")
    return [
        ("sweep", sweep_figure(table, dense).update_layout(title=run.label)),
        ("compression", compression),
    ]


def _classification(run: Committed) -> Figures:
    """ResNet-32 per method: test accuracy and compression per epoch, averaged over seeds."""
    from rlq.analysis.gst import mean_over_seeds
    from rlq.vision.figures import training_figure

    title = f"{run.label}: ResNet-32, {run.params.get('epochs')} epochs, mean over seeds"
    return [("training", training_figure(mean_over_seeds(run.table("history")), title))]


def _ptq(run: Committed) -> Figures:
    """Post-training quantization: each agent's return per precision, then return against weight bits."""
    from rlq.analysis.quarl.quantization_figures import bit_sweep_figure, ptq_bars_figure

    bars = ptq_bars_figure(run.table("ptq_summary"))
    bars.update_layout(title=f"{run.label}: each agent at fp32, fp16 and int8")
    sweep = bit_sweep_figure(run.table("ptq"), float(run.params["tolerance"]))
    return [("ptq_bars", bars), ("bit_sweep", sweep)]


def _qat(run: Committed) -> Figures:
    """QAT against PTQ: mean return per weight width, fp32 dashed."""
    from rlq.analysis.quarl.quantization_figures import qat_vs_ptq_figure
    from rlq.analysis.quarl.quantization_tables import qat_summary

    figure = qat_vs_ptq_figure(qat_summary(run.table("qat")))
    return [
        ("qat_vs_ptq", figure.update_layout(title=f"{run.label}: mean return over seeds per weight width"))
    ]


def _actorq(run: Committed) -> Figures:
    """ActorQ: int8 over fp32 per replay-rate regime; then the regimes with compiled actors where the run has
    them, else the cost model at the paper's setting and the learning curves."""
    from rlq.analysis.quarl.quantization_figures import regime_figure, speedup_curve_figure

    regimes = regime_figure(run.table("regime_comparison"), run.table("regime_estimates"))
    if run.has("compiled_regime_comparison"):  # the regimes again: fp32 PyTorch against int8 compiled actors
        return [("regimes", regimes), *_compiled_actors(run)]
    figures = [("regimes", regimes), ("paper_setting", speedup_curve_figure(run.table("paper_curve")))]
    if run.has("convergence_curve") and run.has(
        "convergence_runs"
    ):  # the convergence section's learning curves
        from rlq.analysis.quarl.convergence import return_at
        from rlq.analysis.quarl.quantization_figures import convergence_figure

        curve = run.table("convergence_curve")
        thresholds = run.table("convergence_runs").groupby("task")["threshold"].first().to_dict()
        figure = convergence_figure(
            return_at(curve, "env_steps", points=10), return_at(curve, "wall_time_s", points=10), thresholds
        )
        # the convergence tasks, not the throughput sections' env_ids, name this figure's task
        title = f"{run.experiment} {run.preset} ({', '.join(thresholds)}): IQM and 95% interval over seeds"
        figures.append(("convergence", figure.update_layout(title=title)))
    return figures


def _compiled_actors(run: Committed) -> Figures:
    """ActorQ's regimes with fp32 PyTorch actors against int8 actors on the compiled kernels: speedup and actor time."""
    from rlq.analysis.quarl.quantization_figures import engine_breakdown_figure, regime_figure

    target = float(run.results["compiled_actor_target"])
    speedup = regime_figure(run.table("compiled_regime_comparison"), run.table("compiled_regime_estimates"),
                            target=target, target_label=f"our target {target:g}x")  # fmt: skip
    speedup.update_layout(title=f"{run.label}:<br>int8 compiled over fp32 PyTorch actors, end to end")
    breakdown = engine_breakdown_figure(
        run.table("compiled_breakdown"), f"{run.label}: actors' time per environment step by part"
    )
    return [("compiled_regimes", speedup), ("compiled_breakdown", breakdown)]


def _combo(run: Committed) -> Figures:
    """Sparsity with quantization: per task, return against bits per weight with the Pareto front."""
    from rlq.analysis.pareto_figures import pareto_figure

    reference = {"20x (1.6 bits)": 1.6, "50x (0.64)": 0.64}
    return [
        (
            "pareto_" + re.sub(r"[^a-z0-9]+", "_", str(env_id).lower()).strip("_"),
            pareto_figure(
                table,
                "bits_per_weight",
                title=f"{run.experiment} {run.preset} ({env_id}): return against bits per weight",
                reference=reference,
            ),
        )
        for env_id, table in run.table("summary").groupby("env_id", sort=False)
    ]


def _deploy(run: Committed) -> Figures:
    """An exported policy: bytes stored per format, and each exported policy's return beside PyTorch's."""
    sizes = run.table("sizes")
    stored = go.Figure(
        go.Bar(x=sizes["policy"], y=sizes["bytes"], text=sizes["bytes"], textposition="outside")
    )
    stored.update_layout(
        title=f"{run.label}: bytes of the actor's weights as exported (log scale)",
        yaxis=dict(type="log", title="bytes"),
        xaxis=dict(title=None),
    )
    evaluation = run.table("evaluation")
    returns = go.Figure(
        go.Scatter(
            x=evaluation["policy"],
            y=evaluation["value"],
            mode="markers",
            error_y=dict(
                type="data",
                symmetric=False,
                array=evaluation["upper"] - evaluation["value"],
                arrayminus=evaluation["value"] - evaluation["lower"],
            ),
        )
    )
    returns.update_layout(
        title=f"{run.label}: mean return over the same episodes, 95% bootstrap interval",
        yaxis=dict(title="return"),
    )
    return [("stored_bytes", stored), ("returns", returns)]


def _block_deploy(run: Committed) -> Figures:
    """Block-pruned GST deployed (exploratory): return per arm, then each compiled actor's speed against its targets."""
    from rlq.analysis.shared_figures import interval_figure, target_ratio_figure
    from rlq.stats import estimates_by

    returns = interval_figure(
        estimates_by(run.table("summary"), "eval_return"),
        unit="return",
        title=f"{run.label}, exploratory: evaluation return per arm, IQM over seeds with 95% interval",
    )
    speed = target_ratio_figure(
        run.table("latency"),
        run.results["speed_targets"],
        title=f"{run.label}, exploratory: batch-1 speed of each compiled final actor (dashed: the target)",
    )
    return [("returns", returns), ("speed", speed)]


FIGURES: dict[str, Callable[[Committed], Figures]] = {
    "baseline_rl": _baseline,
    "gst_td3_mujoco": _gst_run,
    "gst_a2c_atari": _gst_run,
    "gst_ppo_football": _gst_run,
    "gst_sweep": _sweep,
    "gst_classification": _classification,
    "quarl_ptq": _ptq,
    "quarl_qat": _qat,
    "quarl_actorq": _actorq,
    "combo_sparse_quant": _combo,
    "deploy_policy": _deploy,
    "gst_block_deploy": _block_deploy,
}
"""Experiment -> its headline figures, as (file name without .png, figure), from a committed run's tables."""


def committed_runs(results_dir: str | Path | None = None) -> list[Committed]:
    """Return every committed run (a folder with a results.json) under ``results_dir`` (default data/results)."""
    root = Path(results_dir) if results_dir is not None else data_dir() / "results"
    return [
        Committed(path.parent.parent.name, path.parent.name, path.parent)
        for path in sorted(root.glob(f"*/*/{RESULTS_FILE}"))
        if not read_json(path).get("confirmatory")  # the registered design's runs have no headline figures
    ]


def committed_figures(experiment: str, preset: str, results_dir: str | Path | None = None) -> Figures:
    """Return the headline figures of ``experiment``'s committed ``preset`` run; FigureError naming the table on failure."""
    root = Path(results_dir) if results_dir is not None else data_dir() / "results"
    return _build(Committed(experiment, preset, root / experiment / preset))


def _build(run: Committed) -> Figures:
    builder = FIGURES.get(run.experiment)
    if builder is None:
        raise FigureError(f"{run.experiment}/{run.preset}: no figures for {run.experiment} in FIGURES")
    try:
        figures = builder(run)
    except FigureError:
        raise
    except Exception as e:
        where = f"table {run.loaded[-1]}.csv" if run.loaded else "its results.json or params.json"
        raise FigureError(
            f"{run.experiment}/{run.preset}: a figure failed on {where} "
            f"(tables read: {', '.join(run.loaded) or 'none'}): {type(e).__name__}: {e}"
        ) from e
    if not figures:
        raise FigureError(f"{run.experiment}/{run.preset}: its builder returned no figure")
    return figures


def shrink_png(png: bytes) -> bytes:
    """Return ``png`` with a 256-colour palette (a Plotly figure looks the same at a third of the bytes), or as is without Pillow."""
    try:
        from PIL import Image
    except ImportError:  # Pillow comes with matplotlib; without it the PNGs are only larger
        return png
    image = Image.open(io.BytesIO(png)).convert("RGB")
    palette = image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue()


def write_pngs(jobs: list[tuple[Path, go.Figure, int]], width: int = WIDTH) -> list[Path]:
    """Return the paths written: each (path, figure, height) as a PNG at ``width`` in one browser session."""
    import kaleido

    try:
        kaleido.start_sync_server(silence_warnings=True)
    except Exception as e:
        raise FigureError(f"static export needs kaleido and Chromium (apt install chromium): {e}") from e
    try:
        for path, figure, height in jobs:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="The kopts argument is ignored")
                    png = figure.to_image(format="png", width=width, height=height, scale=SCALE)
            except Exception as e:
                raise FigureError(f"rendering {path} failed (kaleido needs Chromium): {e}") from e
            path.write_bytes(shrink_png(png))
    finally:
        kaleido.stop_sync_server(silence_warnings=True)
    return [path for path, _, _ in jobs]


def render_committed_figures(results_dir: str | Path | None = None) -> list[Path]:
    """Return the PNGs written: every committed run's :data:`FIGURES` as ``<its folder>/<name>.png``."""
    jobs = [
        (
            run.folder / f"{name}.png",
            figure,
            max(HEIGHT, int(figure.layout.height or 0)),
        )  # tall ones keep theirs
        for run in committed_runs(results_dir)
        for name, figure in _build(run)
    ]
    return write_pngs(jobs)


def claims_figures(results_dir: str | Path | None = None) -> Figures:
    """Return ``claims_<family>`` and the report's forest plot of each claim family, on the committed results alone."""
    from rlq.faces.report import claims_table, collect_runs
    from rlq.faces.report_figures import family_figures

    with tempfile.TemporaryDirectory() as no_runs:  # the README's verdicts: an empty runs folder
        records = collect_runs(no_runs, results_dir)
    return [
        ("claims_" + re.sub(r"[^a-z0-9]+", "_", family.lower()).strip("_"), figure)
        for family, figure in family_figures(claims_table(records))
    ]


CONFIRMATORY_PNG = "confirmatory.png"


def render_confirmatory_figure(out_dir: str | Path, root: Path | None = None) -> list[Path]:
    """Return the PNG written: the values behind each confirmatory verdict of the checkout ``root`` (default
    this one), as ``out_dir/confirmatory.png``, at its own height."""
    from rlq.faces.report_confirmatory import decided_claims
    from rlq.faces.report_figures import confirmatory_figure

    figure = confirmatory_figure(decided_claims(root))
    return write_pngs([(Path(out_dir) / CONFIRMATORY_PNG, figure, int(figure.layout.height))])


def render_claims_figures(out_dir: str | Path, results_dir: str | Path | None = None) -> list[Path]:
    """Return the PNGs written: each claim family's forest plot as ``out_dir/claims_<family>.png``, at its own height."""
    out_dir = Path(out_dir)
    jobs = [
        (out_dir / f"{name}.png", figure, int(figure.layout.height or HEIGHT))
        for name, figure in claims_figures(results_dir)
    ]
    return write_pngs(jobs)
