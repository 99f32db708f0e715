"""QuaRL's tables: post-training quantization's (``quarl_ptq``) per agent, per width, over seeds, and headline
numbers; QAT's summary per method and width (``quarl_qat``, and its static figure).

The PTQ tables read the notebook's evaluation table: one row per agent (``run``, ``seed``) and precision, with its
``scheme`` (:data:`rlq.sb3.quantized.SCHEMES`: float casts, int8 ``kernel``, ``weights-only`` simulated
widths, ``onnx``, and the matched ``noise`` control), ``mean_return``, ``relative_change`` against fp32,
``random_return`` and ``solved``. A width whose noise draws break the agent as often as quantization does
shows a fragile agent, not a bad quantizer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from rlq.sb3.quantized import FLOAT, KERNEL, NOISE, ONNX, WEIGHTS_ONLY, weights_only


def lowest_weights_only_bits(agent: pd.DataFrame, tolerance: float) -> int | None:
    """Return the lowest weights-only width from which every wider one keeps the return within ``tolerance`` of fp32.

    Ranks the weights-only sweep alone (8 bits simulated like the rest), never the int8 kernels, which also
    quantize activations (:func:`rlq.sb3.quantized.lowest_bits_within`); None when the widest already fails.
    """
    from rlq.quant.tensor import SIMULATED_INT8
    from rlq.sb3.quantized import lowest_bits_within

    sweep = agent[agent.scheme == WEIGHTS_ONLY]
    names = [SIMULATED_INT8 if b == 8 else f"int{b}" for b in sweep["bits"]]  # "int8" names the kernels
    return lowest_bits_within(sweep.assign(precision=names), tolerance)


def _value(agent: pd.DataFrame, precision: str, scheme: str, column: str = "mean_return") -> float:
    rows = agent.loc[(agent.precision == precision) & (agent.scheme == scheme), column]
    return float(rows.mean()) if len(rows) else float("nan")


def ptq_summary(ptq: pd.DataFrame, tolerance: float) -> pd.DataFrame:
    """Return one row per run and seed: whether fp32 solved the task; fp32, fp16, kernel and weights-only int8 returns; changes in %; the lowest enough weights-only bits; the noise control at 8 bits."""
    rows = []
    for (run, seed), agent in ptq.groupby(["run", "seed"], sort=False):
        row = dict(
            run=run,
            seed=int(seed),
            solved=bool(agent["solved"].iloc[0]),
            fp32=_value(agent, "fp32", FLOAT),
            fp16=_value(agent, "fp16", FLOAT),
            int8=_value(agent, "int8", KERNEL),
            int8_weights_only=_value(agent, "sim8", WEIGHTS_ONLY),
            fp16_change_pct=100 * _value(agent, "fp16", FLOAT, "relative_change"),
            int8_change_pct=100 * _value(agent, "int8", KERNEL, "relative_change"),
            int8_weights_only_change_pct=100 * _value(agent, "sim8", WEIGHTS_ONLY, "relative_change"),
        )
        if (agent.scheme == ONNX).any():
            row["onnx_int8"] = _value(agent, "int8", ONNX)
        noise8 = agent[(agent.scheme == NOISE) & (agent.bits == 8)]
        if len(noise8):
            row["noise8_mean"] = float(noise8["mean_return"].mean())
            row["noise8_broken"] = f"{int((noise8['relative_change'] < -tolerance).sum())}/{len(noise8)}"
        row["lowest_bits_within_tolerance"] = lowest_weights_only_bits(agent, tolerance)
        row["random"] = float(agent["random_return"].iloc[0])
        rows.append(row)
    return pd.DataFrame(rows)


def noise_control_table(ptq: pd.DataFrame, tolerance: float) -> pd.DataFrame:
    """Return per run, seed and width: the weights-only quantized return beside its noise draws' mean, min and broken count.

    A draw (or the quantized agent) is broken when its return falls more than ``tolerance`` below fp32.
    """
    rows = []
    noise = ptq[ptq.scheme == NOISE]
    for (run, seed, bits), draws in noise.groupby(["run", "seed", "bits"], sort=False):
        agent = ptq[(ptq.run == run) & (ptq.seed == seed)]
        change = _value(agent, weights_only(bits), WEIGHTS_ONLY, "relative_change")
        rows.append(
            dict(
                run=run,
                seed=int(seed),
                bits=int(bits),
                solved=bool(agent["solved"].iloc[0]),
                fp32=_value(agent, "fp32", FLOAT),
                quantized=_value(agent, weights_only(bits), WEIGHTS_ONLY),
                quantized_broken=bool(change < -tolerance),
                noise_mean=float(draws["mean_return"].mean()),
                noise_min=float(draws["mean_return"].min()),
                noise_broken=int((draws["relative_change"] < -tolerance).sum()),
                noise_draws=len(draws),
            )
        )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------------
# Over seeds: interval estimates and headline numbers


def judged_agents(summary: pd.DataFrame) -> pd.DataFrame:
    """Return the rows of :func:`ptq_summary` a claim is judged on: the solved agents (all of them when none solved)."""
    return summary[summary["solved"]] if summary["solved"].any() else summary


def seed_task_matrix(rows: pd.DataFrame, column: str) -> np.ndarray:
    """Return ``rows[column]`` as a ``(seeds, tasks)`` array, or pooled ``(agents,)`` when tasks have unequal seeds.

    rliable's stratified bootstrap needs a rectangle: solved agents may leave a task with fewer seeds, and
    then every (seed, task) value is one run of one pooled task.
    """
    groups = [g[column].to_numpy(dtype=float) for _, g in rows.groupby("run", sort=False)]
    if len({len(g) for g in groups}) == 1:
        return np.stack(groups, axis=1)
    return np.concatenate(groups)


def enough_bits(summary: pd.DataFrame) -> pd.Series:
    """Return the lowest weights-only width within tolerance per row, 32 where no integer width is (fp32 needed)."""
    return summary["lowest_bits_within_tolerance"].astype(float).fillna(32.0)


def ptq_estimates(summary: pd.DataFrame, reps: int = 2000) -> dict[str, dict[str, Any]]:
    """Return the IQM over seeds and tasks with its 95% interval of int8's change and the enough bits, on solved agents.

    ``int8_reward_change_pct`` (kernel int8 vs fp32, %; negative: a loss), ``int8_reward_drop_pct`` (its
    negation), ``int8_weights_only_change_pct`` and ``lowest_bits_within_tolerance`` (weights-only, bits; 32
    where no width keeps the return); empty when no agent solved its task.
    """
    from rlq.stats import estimate

    solved = summary[summary["solved"]].assign(enough_bits=lambda d: enough_bits(d))
    if solved.empty:
        return {}
    change = estimate(seed_task_matrix(solved, "int8_change_pct"), reps=reps)
    return {
        "int8_reward_change_pct": change.as_dict("%"),
        "int8_reward_drop_pct": {
            **change.as_dict("%"),
            "value": -change.value,
            "lower": -change.upper,
            "upper": -change.lower,
        },
        "int8_weights_only_change_pct": estimate(
            seed_task_matrix(solved, "int8_weights_only_change_pct"), reps=reps
        ).as_dict("%"),
        "lowest_bits_within_tolerance": estimate(seed_task_matrix(solved, "enough_bits"), reps=reps).as_dict(
            "bits"
        ),
    }


def precision_intervals(ptq: pd.DataFrame, reps: int = 2000) -> pd.DataFrame:
    """Return the IQM with its 95% interval of the return change vs fp32 (%) per precision, over solved agents' seeds and tasks.

    One row per precision (``method``): fp16, int8 kernels, int8 weights-only, every weights-only width,
    and the noise control per width (each agent's mean over its draws).
    """
    from rlq.stats import interval_estimates

    judged = ptq[ptq["solved"]] if ptq["solved"].any() else ptq
    judged = judged[judged.backend == "torch"].assign(change_pct=lambda d: 100 * d["relative_change"])
    labels = {("fp16", FLOAT): "fp16", ("int8", KERNEL): "int8 kernels (weights + activations)"}
    order = [("fp16", FLOAT), ("int8", KERNEL)]
    for scheme, label in ((WEIGHTS_ONLY, "{} bits weights-only"), (NOISE, "noise of a {}-bit step")):
        for bits in sorted(judged.loc[judged.scheme == scheme, "bits"].unique(), reverse=True):
            order.append((weights_only(bits), scheme))
            labels[(weights_only(bits), scheme)] = label.format(bits)
    scores = {}
    for precision, scheme in order:
        rows = judged[(judged.precision == precision) & (judged.scheme == scheme)]
        per_agent = rows.groupby(["run", "seed"], sort=False)["change_pct"].mean().reset_index()
        if len(per_agent):
            scores[labels[(precision, scheme)]] = seed_task_matrix(per_agent, "change_pct")
    return interval_estimates(scores, metrics=("iqm",), reps=reps)


def ptq_numbers(summary: pd.DataFrame, tolerance: float) -> dict[str, Any]:
    """Return a PTQ run's headline numbers per run and seed, the worst int8 change and the enough bits on solved agents.

    ``worst_int8_relative_change`` and ``lowest_bits_within_tolerance`` (per run, the most bits any judged
    seed needs; 32: fp32) are read from the solved agents (:func:`judged_agents`).
    """

    def per_seed(column: str, scale: float | None = None) -> dict[str, dict[str, Any]]:
        def value(row: Any) -> Any:
            return getattr(row, column) if scale is None else getattr(row, column) * scale

        return {
            run: {str(r.seed): value(r) for r in g.itertuples()}
            for run, g in summary.groupby("run", sort=False)
        }

    judged = judged_agents(summary).assign(enough_bits=lambda d: enough_bits(d))
    return {
        "int8_relative_change": per_seed("int8_change_pct", 0.01),
        "int8_weights_only_relative_change": per_seed("int8_weights_only_change_pct", 0.01),
        "fp16_relative_change": per_seed("fp16_change_pct", 0.01),
        "lowest_bits_within_tolerance": {
            run: int(g["enough_bits"].max()) for run, g in judged.groupby("run", sort=False)
        },
        "fp32_return": per_seed("fp32"),
        "int8_return": per_seed("int8"),
        "solved": per_seed("solved"),
        "worst_int8_relative_change": float(judged["int8_change_pct"].min() / 100),
        "n_solved": int(summary["solved"].sum()),
        "n_agents": len(summary),
        "seeds": sorted(int(s) for s in summary["seed"].unique()),
        "tolerance": tolerance,
        "n_runs": int(summary["run"].nunique()),
    }


def qat_summary(qat_table: pd.DataFrame) -> pd.DataFrame:
    """Return the mean and standard deviation over seeds of each run's return, per method (fp32, ptq, qat) and bit width."""
    return (
        qat_table.groupby(["run", "method", "bits"], sort=False)["mean_return"]
        .agg(["mean", "std"])
        .reset_index()
        .fillna({"std": 0.0})
    )
