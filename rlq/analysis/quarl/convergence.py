"""ActorQ's convergence section (``quarl_actorq``): do int8 actors learn as fp32 ones do, and how much sooner?

The runs are the notebook's ActorQ runs keyed ``(task, seed, precision)``, each configured by
:func:`rlq.analysis.quarl.regimes.regime_config` with the task's overrides (its ``env_id`` among them), fp32
and int8 actors on every seed. From their evaluation histories:

- :func:`convergence_curves`: every evaluation of every run (return against environment steps and wall time);
- :func:`convergence_runs`: per run its initial and final return (the mean of its last ``final_evals``
  evaluations: one evaluation of a few episodes is noisy), and the wall time and environment steps at which it
  first reached ``fraction`` (90%) of the fp32 runs' mean final return on that task;
- :func:`return_at`: IQM and 95% interval over seeds of the return at equal environment steps (or wall time);
- :func:`convergence_estimates` and :func:`convergence_numbers`: the estimates that ``rlq report`` judges,
  int8's change of final return against fp32 on the same seed, and the ratio of times to the threshold.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from rlq.actorq.result import time_to_return
from rlq.analysis.quarl.regimes import RegimeResults
from rlq.core.validation import check_positive_int

CURVE_COLUMNS = ["task", "seed", "precision", "learner_steps", "env_steps", "wall_time_s", "eval_return",
                 "actor_saturated_share"]  # fmt: skip


def convergence_curves(results: RegimeResults) -> pd.DataFrame:
    """Return one row per evaluation of every run: task, seed, precision, steps, wall time, return, saturation."""
    frames = []
    for (task, seed, precision), r in results.items():
        h = r.history.assign(task=task, seed=int(seed), precision=precision)
        frames.append(h.reindex(columns=CURVE_COLUMNS))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=CURVE_COLUMNS)


def _first_reaching(history: pd.DataFrame, threshold: float, column: str) -> float:
    found = time_to_return(history, threshold, column)
    return np.nan if found is None else found


def final_return(history: pd.DataFrame, final_evals: int = 1) -> float:
    """Return the mean evaluation return of a run's last ``final_evals`` evaluations (all it has, if fewer)."""
    return float(history["eval_return"].iloc[-final_evals:].mean())


def convergence_runs(results: RegimeResults, fraction: float = 0.9, final_evals: int = 1) -> pd.DataFrame:
    """Return one row per run: initial and final return, the task's threshold and when the run first reached it.

    A run's final return is the mean of its last ``final_evals`` evaluations (:func:`final_return`), its
    initial return its policy's before the first update. The threshold of a task is ``fraction`` of the mean
    final return of its fp32 runs (every seed); a run that never reached it has NaN time and steps.
    ``beats_initial``: the final return is above the initial one; ``last_return`` is the last evaluation alone.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction!r}: the share of fp32's final return must be in (0, 1]")
    final_evals = check_positive_int("final_evals", final_evals)
    finals: dict[str, list[float]] = {}
    for (task, _, precision), r in results.items():
        if precision == "fp32":
            finals.setdefault(task, []).append(final_return(r.history, final_evals))
    missing = sorted({task for task, *_ in results} - set(finals))
    if missing:
        raise ValueError(f"no fp32 run of task(s) {missing}: the threshold is a share of fp32's final return")
    rows = []
    for (task, seed, precision), r in results.items():
        h = r.history
        threshold = fraction * float(np.mean(finals[task]))
        initial, final = float(h["eval_return"].iloc[0]), final_return(h, final_evals)
        rows.append(
            dict(
                task=task, seed=int(seed), precision=precision, initial_return=initial, final_return=final,
                last_return=float(h["eval_return"].iloc[-1]), beats_initial=final > initial, threshold=threshold,
                time_to_threshold_s=_first_reaching(h, threshold, "wall_time_s"),
                steps_to_threshold=_first_reaching(h, threshold, "env_steps"),
                env_steps=int(r.env_steps), wall_time_s=float(r.wall_time_s),
            )
        )  # fmt: skip
    return pd.DataFrame(rows)


def return_at(curves: pd.DataFrame, x: str = "env_steps", points: int = 5, seed: int = 0) -> pd.DataFrame:
    """Return per task, precision and point of ``x`` the IQM and 95% interval over seeds of the return there.

    ``x`` is ``env_steps`` (return at equal environment steps) or ``wall_time_s`` (at equal training time);
    the points are spread evenly up to the smallest final ``x`` of the task's runs, and each run's return
    there is interpolated linearly between its evaluations.
    """
    from rlq.stats import estimate

    if x not in ("env_steps", "wall_time_s"):
        raise ValueError(f"x={x!r}: choose env_steps or wall_time_s")
    rows = []
    for task, runs in curves.groupby("task", sort=False):
        end = float(runs.groupby(["seed", "precision"])[x].max().min())
        grid = np.linspace(end / points, end, points)
        for precision, group in runs.groupby("precision", sort=False):
            matrix = np.array([np.interp(grid, g[x], g["eval_return"]) for _, g in group.groupby("seed")])
            for j, at in enumerate(grid):
                est = estimate(matrix[:, j], seed=seed)
                rows.append({"task": task, "precision": precision, x: int(round(at)) if x == "env_steps" else at,
                             "value": est.value, "lower": est.lower, "upper": est.upper, "n": est.n})  # fmt: skip
    return pd.DataFrame(rows, columns=["task", "precision", x, "value", "lower", "upper", "n"])


def paired(runs: pd.DataFrame, column: str, precision: str = "int8") -> pd.DataFrame:
    """Return per task and seed the fp32 and ``precision`` runs' ``column`` side by side (``fp32``, ``quant``)."""
    wide = runs.pivot_table(index=["task", "seed"], columns="precision", values=column, dropna=False)
    if "fp32" not in wide or precision not in wide:
        return pd.DataFrame(columns=["task", "seed", "fp32", "quant"])
    return wide[["fp32", precision]].set_axis(["fp32", "quant"], axis=1).reset_index()


def convergence_estimates(runs: pd.DataFrame, precision: str = "int8", seed: int = 0) -> pd.DataFrame:
    """Return per task (and ``all`` tasks pooled) the IQM and 95% interval over seeds of each measure.

    Measures: ``final_return_<p>`` for fp32 and ``precision``; ``final_return_change_pct``, 100 (quant - fp32)
    / fp32 final return on the same seed; ``time_to_threshold_s_<p>``; ``time_ratio``, fp32's time to the
    threshold over the quantized run's on the same seed (seeds where both reached it).
    """
    from rlq.stats import estimate

    final = paired(runs, "final_return", precision)
    times = paired(runs, "time_to_threshold_s", precision)
    final["change_pct"] = 100.0 * (final["quant"] - final["fp32"]) / final["fp32"].abs()
    times["ratio"] = times["fp32"] / times["quant"]
    rows = []
    tasks = [*dict.fromkeys(runs["task"])]
    for task in [*tasks, "all"]:
        f = final if task == "all" else final[final["task"] == task]
        t = times if task == "all" else times[times["task"] == task]
        measures = {
            "final_return_fp32": f["fp32"], f"final_return_{precision}": f["quant"],
            "final_return_change_pct": f["change_pct"], "time_to_threshold_s_fp32": t["fp32"],
            f"time_to_threshold_s_{precision}": t["quant"], "time_ratio": t["ratio"],
        }  # fmt: skip
        for measure, values in measures.items():
            values = values.to_numpy(dtype=float)
            values = values[np.isfinite(values)]
            if len(values):
                est = estimate(values, seed=seed)
                rows.append(dict(task=task, measure=measure, value=est.value, lower=est.lower, upper=est.upper,
                                 n=est.n))  # fmt: skip
    return pd.DataFrame(rows, columns=["task", "measure", "value", "lower", "upper", "n"])


def convergence_numbers(
    estimates: pd.DataFrame,
    runs: pd.DataFrame,
    time_task: str,
    fraction: float,
    predicted: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """Return the section's numbers for ``rlq.record``: the two claims' estimates and every task's measures.

    ``estimates["int8_final_return_change_pct"]``: int8's final return change against fp32 (%, pooled over
    tasks and seeds); ``estimates["time_to_return_speedup_int8_vs_fp32"]``: the ratio of times to ``fraction``
    of fp32's final return on ``time_task``. ``predicted`` (:func:`regime_comparison` of the same runs) adds the
    cost model's and the measured steady speedups per task.
    """
    by = {(r.task, r.measure): r for r in estimates.itertuples()}

    def record(task: str, measure: str, unit: str) -> dict[str, Any] | None:
        row = by.get((task, measure))
        if row is None:
            return None
        return {"value": float(row.value), "lower": float(row.lower), "upper": float(row.upper), "n": int(row.n),
                "unit": unit, "task": task}  # fmt: skip

    if time_task not in set(runs["task"]):
        raise ValueError(
            f"time_task={time_task!r} is not one of the convergence tasks {sorted(set(runs['task']))}"
        )
    out: dict[str, Any] = {"estimates": {}, "convergence": {}}
    for name, (task, measure, unit) in {
        "int8_final_return_change_pct": ("all", "final_return_change_pct", "%"),
        "time_to_return_speedup_int8_vs_fp32": (time_task, "time_ratio", "x"),
    }.items():
        found = record(task, measure, unit)
        if found is not None:
            out["estimates"][name] = found
    for task, group in estimates.groupby("task", sort=False):
        out["convergence"][task] = {
            r.measure: {"value": r.value, "lower": r.lower, "upper": r.upper, "n": int(r.n)}
            for r in group.itertuples()
        }
    out["convergence_runs_above_initial"] = f"{int(runs['beats_initial'].sum())} of {len(runs)}"
    out["convergence_threshold_fraction"] = float(fraction)
    if predicted is not None and len(predicted):
        out["convergence_steady_speedup"] = {
            str(task): {"measured": float(g["measured_speedup"].median()),
                        "predicted": float(g["predicted_speedup"].median())}
            for task, g in predicted.groupby("regime", sort=False)
        }  # fmt: skip
    return out
