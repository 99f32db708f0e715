"""QuaRL quantization-aware training against PTQ (``quarl_qat``): per run, seed and bit width, tables and numbers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from rlq.experiments.quarl.runs import CALIBRATION_SEED_OFFSET, Progress, RunSpec
from rlq.rl.evaluate import EVAL_SEED_OFFSET

if TYPE_CHECKING:
    from rlq.rl.agents import TrainedAgent
    from rlq.rl.evaluate import EvalResult


def ptq_after_training(
    spec: RunSpec,
    seed: int,
    *,
    bits: Sequence[int],
    eval_episodes: int,
    per_channel: bool,
    activations: bool,
    n_envs_on_policy: int,
    calibration_steps: int,
    checkpoint_every: int,
    folder: str | Path,
) -> tuple[TrainedAgent, np.ndarray, pd.DataFrame]:
    """Return the fp32 agent of ``spec`` and ``seed``, the observations that calibrate it, and its return at fp32 and each of ``bits``.

    The agent trains (or resumes) in ``folder/fp32``; the evaluation plays ``eval_episodes`` episodes seeded
    ``seed +`` :data:`EVAL_SEED_OFFSET`, the calibration rollout is seeded ``seed +`` :data:`CALIBRATION_SEED_OFFSET`.
    """
    from rlq.sb3.quantized import collect_observations, evaluate_precisions

    fp32 = spec.train(
        Path(folder) / "fp32", seed=seed, n_envs_on_policy=n_envs_on_policy, checkpoint_every=checkpoint_every
    )
    calibration = collect_observations(
        spec.env_id, calibration_steps, model=fp32.model, seed=seed + CALIBRATION_SEED_OFFSET
    )
    table = evaluate_precisions(
        fp32.model,
        spec.env_id,
        ["fp32", *[f"int{b}" for b in bits]],
        eval_episodes,
        seed + EVAL_SEED_OFFSET,
        calibration_obs=calibration,
        per_channel_linear=per_channel,
        activations=activations,
    )
    return fp32, calibration, table


def qat_agent(
    spec: RunSpec,
    seed: int,
    bits: int,
    *,
    delay_fraction: float,
    eval_episodes: int,
    per_channel: bool,
    activations: bool,
    skip_first_last: bool,
    n_envs_on_policy: int,
    calibration: np.ndarray,
    checkpoint_every: int,
    folder: str | Path,
) -> tuple[TrainedAgent, EvalResult, int | None]:
    """Return the agent trained with QAT at ``bits``, its return as deployed, and the step its quantization switched on.

    Fake quantization starts after ``delay_fraction`` of training (:class:`rlq.sb3.qat.QATCallback`); the agent
    trains (or resumes) in ``folder/qat<bits>`` with the fp32 agent's seed, and plays the fp32 agent's episodes.
    It is evaluated with its weights at ``bits`` and the activation quantizers it trained; one loaded from a
    checkpoint has none and gets ones calibrated on ``calibration``, like PTQ.
    """
    from rlq.quant.activations import input_quantizers
    from rlq.rl.evaluate import evaluate
    from rlq.sb3.qat import QATCallback
    from rlq.sb3.quantized import quantized_policy

    callback = QATCallback(
        bits,
        delay_steps=int(delay_fraction * spec.steps),
        activations=activations,
        per_channel=per_channel,
        skip_first_last=skip_first_last,
    )
    trained = spec.train(
        Path(folder) / f"qat{bits}",
        seed=seed,
        n_envs_on_policy=n_envs_on_policy,
        checkpoint_every=checkpoint_every,
        callback=callback,
    )
    fresh_activations = activations and not input_quantizers(trained.model.policy)
    policy = quantized_policy(
        trained.model,
        f"int{bits}",
        calibration_obs=calibration,
        per_channel_linear=per_channel,
        activations=fresh_activations,
    )
    result = evaluate(policy, spec.env_id, n_episodes=eval_episodes, seed=seed + EVAL_SEED_OFFSET)
    return trained, result, callback.history[-1]["step"] if callback.history else None


def qat_vs_ptq(
    specs: Sequence[RunSpec],
    seeds: Sequence[int],
    *,
    bits: Sequence[int],
    delay_fraction: float,
    eval_episodes: int,
    per_channel: bool,
    activations: bool,
    skip_first_last: bool,
    n_envs_on_policy: int,
    calibration_steps: int,
    checkpoint_every: int,
    out: str | Path,
    progress: Progress = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return every evaluation (fp32, PTQ and QAT per run, seed and bit width) and every learning curve.

    Per run and seed: :func:`ptq_after_training`, then :func:`qat_agent` per bit width, in
    ``out/agents/<run>/seed<seed>/``; ``progress`` gets a line per bit width.
    """
    shared = dict(
        eval_episodes=eval_episodes,
        per_channel=per_channel,
        activations=activations,
        n_envs_on_policy=n_envs_on_policy,
        checkpoint_every=checkpoint_every,
    )
    evaluations, curves = [], []
    for spec in specs:
        for seed in seeds:
            folder = Path(out) / "agents" / spec.folder / f"seed{seed}"
            common = dict(algorithm=spec.algorithm, environment=spec.env_id, seed=seed)
            fp32, calibration, table = ptq_after_training(
                spec, seed, bits=bits, calibration_steps=calibration_steps, folder=folder, **shared
            )
            curves.append(fp32.curve.assign(method="fp32", bits=32, **common))
            for row in table.itertuples():
                method = "fp32" if row.precision == "fp32" else "ptq"
                evaluations.append(
                    dict(
                        **common,
                        method=method,
                        bits=row.bits,
                        mean_return=row.mean_return,
                        std_return=row.std_return,
                    )
                )
            fp32_return = table.loc[table.precision == "fp32", "mean_return"].iloc[0]
            for b in bits:
                qat, result, qat_from = qat_agent(
                    spec,
                    seed,
                    b,
                    delay_fraction=delay_fraction,
                    skip_first_last=skip_first_last,
                    calibration=calibration,
                    folder=folder,
                    **shared,
                )
                curves.append(qat.curve.assign(method="qat", bits=b, **common))
                evaluations.append(
                    dict(**common, method="qat", bits=b, mean_return=result.mean, std_return=result.std)
                )
                if progress is not None:
                    progress(
                        f"{spec.name} seed {seed}, {b} bits: fp32 {fp32_return:.1f}, "
                        f"PTQ {table.loc[table.bits == b, 'mean_return'].iloc[0]:.1f}, QAT {result.mean:.1f} "
                        f"(QAT on from step {qat_from if qat_from is not None else '-'})"
                    )
    qat_table = pd.DataFrame(evaluations)
    qat_table["run"] = qat_table["algorithm"] + " " + qat_table["environment"]
    return qat_table, pd.concat(curves, ignore_index=True)


def qat_summary(qat_table: pd.DataFrame) -> pd.DataFrame:
    """Return the mean and standard deviation over seeds of each run's return, per method (fp32, ptq, qat) and bit width."""
    return (
        qat_table.groupby(["run", "method", "bits"], sort=False)["mean_return"]
        .agg(["mean", "std"])
        .reset_index()
        .fillna({"std": 0.0})
    )


def qat_vs_ptq_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Return one row per run and bit width: QAT's and PTQ's mean return, fp32's, and QAT minus PTQ."""
    wide = summary.pivot_table(index=["run", "bits"], columns="method", values="mean").reset_index()
    fp32_of = summary[summary.method == "fp32"].set_index("run")["mean"]
    wide = wide[wide.bits != 32].assign(fp32=lambda d: d["run"].map(fp32_of))
    wide["qat_minus_ptq"] = wide["qat"] - wide["ptq"]
    return wide


def qat_numbers(wide: pd.DataFrame, summary: pd.DataFrame) -> dict[str, Any]:
    """Return a QAT run's headline numbers: QAT and PTQ returns per run and bit width, fp32 returns, mean QAT minus PTQ."""
    fp32_of = summary[summary.method == "fp32"].set_index("run")["mean"]
    return {
        "qat_return": {
            run: {str(int(r.bits)): r.qat for r in g.itertuples()} for run, g in wide.groupby("run")
        },
        "ptq_return": {
            run: {str(int(r.bits)): r.ptq for r in g.itertuples()} for run, g in wide.groupby("run")
        },
        "fp32_return": {run: float(v) for run, v in fp32_of.items()},
        "mean_qat_minus_ptq": float(wide["qat_minus_ptq"].mean()),
    }
