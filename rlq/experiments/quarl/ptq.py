"""QuaRL post-training quantization (``quarl_ptq``): each fp32 agent at every precision, tables and headline numbers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from rlq.experiments.quarl.runs import CALIBRATION_SEED_OFFSET, AgentRun
from rlq.rl.evaluate import EVAL_SEED_OFFSET


def ptq_precisions(bit_widths: Sequence[int]) -> list[str]:
    """Return the precisions a PTQ sweep evaluates: fp32, fp16, int8 (real kernels), then the simulated ``bit_widths``."""
    return ["fp32", "fp16", "int8", *[f"int{b}" for b in bit_widths if b != 8]]


PTQ_CACHE = "ptq.csv"
"""An agent's evaluation at every precision, in its folder: a resumed run reads it instead of evaluating again."""


def ptq_table(
    agent: AgentRun,
    *,
    precisions: Sequence[str],
    eval_episodes: int,
    seed: int,
    calibration_steps: int,
    per_channel_linear: bool = False,
    onnx: bool = True,
) -> pd.DataFrame:
    """Return one agent's return at every precision (and with ``onnx`` at fp32 and int8 in ONNX Runtime), beside a random policy's.

    Every precision plays the same episodes (seeded ``seed +`` :data:`EVAL_SEED_OFFSET`); static int8 is
    calibrated on ``calibration_steps`` observations of the fp32 agent's own rollout. The table is cached as
    :data:`PTQ_CACHE` in the agent's folder and read back from there.
    """
    from rlq.rl.evaluate import evaluate, random_policy
    from rlq.sb3.quantized import collect_observations, evaluate_precisions

    cached = agent.folder / PTQ_CACHE
    if cached.exists():
        return pd.read_csv(cached)
    model, env_id, eval_seed = agent.trained.model, agent.spec.env_id, seed + EVAL_SEED_OFFSET
    calibration = collect_observations(
        env_id, calibration_steps, model=model, seed=seed + CALIBRATION_SEED_OFFSET
    )
    parts = [
        evaluate_precisions(
            model,
            env_id,
            precisions,
            eval_episodes,
            eval_seed,
            calibration_obs=calibration,
            per_channel_linear=per_channel_linear,
        )
    ]
    if onnx:
        parts.append(
            evaluate_precisions(
                model,
                env_id,
                ["fp32", "int8"],
                eval_episodes,
                eval_seed,
                backend="onnx",
                calibration_obs=calibration,
            )
        )
    table = pd.concat(parts, ignore_index=True)
    floor = evaluate(random_policy(env_id, seed), env_id, n_episodes=eval_episodes, seed=eval_seed).mean
    table.insert(0, "random_return", floor)
    table.insert(0, "environment", env_id)
    table.insert(0, "algorithm", agent.spec.algorithm)
    table.to_csv(cached, index=False)
    return table


def evaluate_ptq(agents: dict[str, AgentRun], **evaluation: Any) -> pd.DataFrame:
    """Return :func:`ptq_table` of every agent stacked, with each run's name and each precision's normalised score.

    The normalised score is ``(return - random) / (fp32 - random)``: 1 is the fp32 agent, 0 is chance.
    ``evaluation`` holds :func:`ptq_table`'s keyword arguments.
    """
    ptq = pd.concat([ptq_table(agent, **evaluation) for agent in agents.values()], ignore_index=True)
    ptq["run"] = ptq["algorithm"] + " " + ptq["environment"]
    fp32_of = ptq[(ptq.precision == "fp32") & (ptq.backend == "torch")].set_index("run")["mean_return"]
    ptq["normalised_score"] = (ptq["mean_return"] - ptq["random_return"]) / (
        ptq["run"].map(fp32_of) - ptq["random_return"]
    )
    return ptq


def ptq_summary(ptq: pd.DataFrame, tolerance: float) -> pd.DataFrame:
    """Return one row per run: fp32, fp16 and int8 returns (ONNX int8 too when evaluated), changes in %, the lowest enough bits.

    A bit width is enough when its return stays within ``tolerance`` (a fraction) of fp32
    (:func:`rlq.sb3.quantized.lowest_bits_within`).
    """
    from rlq.sb3.quantized import lowest_bits_within

    onnx = bool((ptq.backend == "onnx").any())
    rows = []
    for run, group in ptq.groupby("run", sort=False):
        torch_rows = group[group.backend == "torch"].set_index("precision")
        row = dict(
            run=run,
            fp32=torch_rows.loc["fp32", "mean_return"],
            fp16=torch_rows.loc["fp16", "mean_return"],
            int8=torch_rows.loc["int8", "mean_return"],
            fp16_change_pct=100 * torch_rows.loc["fp16", "relative_change"],
            int8_change_pct=100 * torch_rows.loc["int8", "relative_change"],
        )
        if onnx:
            row["onnx_int8"] = (
                group[group.backend == "onnx"].set_index("precision").loc["int8", "mean_return"]
            )
        row["lowest_bits_within_tolerance"] = lowest_bits_within(group[group.backend == "torch"], tolerance)
        row["random"] = group["random_return"].iloc[0]
        rows.append(row)
    return pd.DataFrame(rows)


def ptq_claim_lines(claims: pd.DataFrame, summary: pd.DataFrame, tolerance: float) -> list[str]:
    """Return QuaRL's PTQ claims (``paper_numbers("quarl", experiment="ptq")``) and ours, one line each."""
    value = claims.set_index("metric")["value"]
    lines = [
        f"QuaRL: int8 loses {value['int8_reward_drop']:.0f}% of the reward; "
        f"{value['enough_bits_min']:.0f}-{value['enough_bits_max']:.0f} bits are usually enough."
    ]
    for row in summary.itertuples():
        lines.append(
            f"ours, {row.run}: int8 changes the return by {row.int8_change_pct:+.1f}%; "
            f"{row.lowest_bits_within_tolerance} bits keep it within {tolerance:.0%} of fp32"
        )
    return lines


def ptq_numbers(summary: pd.DataFrame, tolerance: float) -> dict[str, Any]:
    """Return a PTQ run's headline numbers: per run the int8 and fp16 relative changes, returns and enough bits; the worst int8 change."""
    rows = list(summary.itertuples())
    return {
        "int8_relative_change": {r.run: r.int8_change_pct / 100 for r in rows},
        "fp16_relative_change": {r.run: r.fp16_change_pct / 100 for r in rows},
        "lowest_bits_within_tolerance": {r.run: r.lowest_bits_within_tolerance for r in rows},
        "fp32_return": {r.run: r.fp32 for r in rows},
        "int8_return": {r.run: r.int8 for r in rows},
        "worst_int8_relative_change": float(summary["int8_change_pct"].min() / 100),
        "tolerance": tolerance,
        "n_runs": len(summary),
    }
