"""QuaRL quantization-aware training against PTQ (``quarl_qat``): per run, seed and bit width, tables and numbers."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from rlq.experiments.quarl.evaluation import evaluate_episodes, solved_threshold
from rlq.experiments.quarl.run_specs import CALIBRATION_SEED_OFFSET, Progress, RunSpec
from rlq.rl.evaluate import EVAL_SEED_OFFSET

if TYPE_CHECKING:
    from rlq.rl.agents import TrainedAgent
    from rlq.rl.evaluate import EvalResult


def ptq_after_training(  # noqa: PLR0913
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
    PTQ is the weights-only simulated rule at every width, 8 bits included (``sim8``): the rule QAT trains
    with, so that QAT and PTQ are compared like with like (``int8``'s kernels would requantize on another grid).
    """
    from rlq.experiments.quarl.ptq_sweep import weights_only
    from rlq.sb3.quantized import collect_observations, quantized_policy

    fp32 = spec.train(
        Path(folder) / "fp32", seed=seed, n_envs_on_policy=n_envs_on_policy, checkpoint_every=checkpoint_every
    )
    calibration = collect_observations(
        spec.env_id, calibration_steps, model=fp32.model, seed=seed + CALIBRATION_SEED_OFFSET
    )
    rows = []
    for b in [32, *bits]:
        precision = "fp32" if b == 32 else weights_only(b)
        policy = quantized_policy(
            fp32.model, precision, calibration, per_channel_linear=per_channel, activations=activations
        )
        result = evaluate_episodes(policy, spec.env_id, eval_episodes, seed + EVAL_SEED_OFFSET)
        rows.append(dict(precision=precision, bits=b, mean_return=result.mean, std_return=result.std))
    table = pd.DataFrame(rows)
    return fp32, calibration, table


def qat_agent(
    spec: RunSpec,
    seed: int,
    callback: Any,
    *,
    eval_episodes: int,
    n_envs_on_policy: int,
    calibration: np.ndarray,
    checkpoint_every: int,
    folder: str | Path,
) -> tuple[TrainedAgent, EvalResult, int | None]:
    """Return the agent trained with the QAT ``callback``, its return as deployed, and the step its quantization switched on.

    ``callback`` is a fresh :class:`rlq.sb3.qat_callback.QATCallback` (its bits, delay and options as built in the
    notebook); the agent trains (or resumes) in ``folder/qat<bits>`` with the fp32 agent's seed, and plays
    the fp32 agent's episodes. It is evaluated with its weights at the callback's bits and the activation
    quantizers it trained; one loaded from a checkpoint has none and gets ones calibrated on
    ``calibration``, like PTQ.
    """
    from rlq.experiments.quarl.ptq_sweep import weights_only
    from rlq.quant.activations import input_quantizers
    from rlq.sb3.quantized import quantized_policy

    trained = spec.train(
        Path(folder) / f"qat{callback.bits}",
        seed=seed,
        n_envs_on_policy=n_envs_on_policy,
        checkpoint_every=checkpoint_every,
        callback=callback,
    )
    fresh_activations = callback.activations and not input_quantizers(trained.model.policy)
    policy = quantized_policy(
        trained.model,
        weights_only(callback.bits),
        calibration_obs=calibration,
        per_channel_linear=callback.per_channel,
        activations=fresh_activations,
    )
    result = evaluate_episodes(policy, spec.env_id, eval_episodes, seed + EVAL_SEED_OFFSET)
    return trained, result, callback.history[-1]["step"] if callback.history else None


def qat_seed(  # noqa: PLR0913
    spec: RunSpec,
    seed: int,
    callbacks: Sequence[Any],
    *,
    calibration_steps: int,
    folder: str | Path,
    eval_episodes: int,
    per_channel: bool,
    activations: bool,
    n_envs_on_policy: int,
    checkpoint_every: int,
    torch_threads: int = 1,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return one run and seed's evaluations (fp32, PTQ and QAT per bit width) and learning curves.

    :func:`ptq_after_training` at each callback's bits, then :func:`qat_agent` with a fresh copy of each
    QAT callback, in ``folder``. One job of :func:`qat_vs_ptq` (picklable, for worker processes).
    """
    import torch

    torch.set_num_threads(torch_threads)
    common = dict(algorithm=spec.algorithm, environment=spec.env_id, seed=seed)
    shared = dict(
        eval_episodes=eval_episodes, n_envs_on_policy=n_envs_on_policy, checkpoint_every=checkpoint_every
    )
    fp32, calibration, table = ptq_after_training(
        spec, seed, bits=[c.bits for c in callbacks], calibration_steps=calibration_steps, folder=folder,
        per_channel=per_channel, activations=activations, **shared,
    )  # fmt: skip
    curves = [fp32.curve.assign(method="fp32", bits=32, **common)]
    evaluations = [
        dict(
            **common,
            method="fp32" if r.bits == 32 else "ptq",
            bits=r.bits,
            mean_return=r.mean_return,
            std_return=r.std_return,
        )
        for r in table.itertuples()
    ]
    for callback in callbacks:
        qat, result, qat_from = qat_agent(
            spec, seed, copy.deepcopy(callback), calibration=calibration, folder=folder, **shared
        )
        curves.append(qat.curve.assign(method="qat", bits=callback.bits, **common))
        evaluations.append(
            dict(
                **common,
                method="qat",
                bits=callback.bits,
                mean_return=result.mean,
                std_return=result.std,
                qat_from=qat_from,
            )
        )
    return pd.DataFrame(evaluations), pd.concat(curves, ignore_index=True)


def qat_vs_ptq(  # noqa: PLR0913
    specs: Sequence[RunSpec],
    seeds: Sequence[int],
    callbacks: Mapping[str, Sequence[Any]],
    *,
    eval_episodes: int,
    per_channel: bool,
    activations: bool,
    n_envs_on_policy: int,
    calibration_steps: int,
    checkpoint_every: int,
    out: str | Path,
    workers: int = 1,
    executor: str = "processes",
    ray_address: str | None = None,
    torch_threads: int = 1,
    progress: Progress = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return every evaluation (fp32, PTQ and QAT per run, seed and bit width) and every learning curve.

    ``callbacks[spec.name]`` holds the run's QAT callbacks (:class:`rlq.sb3.qat_callback.QATCallback`, one per bit
    width, as a notebook builds them); the fp32 agent is quantized after training (PTQ, with ``per_channel``
    and ``activations``) at the same widths. One :func:`qat_seed` job per run and seed, ``workers`` at a time
    in processes or Ray tasks (``executor``, ``ray_address``: :func:`rlq.rl.parallel.run_jobs`), in
    ``out/agents/<run>/seed<seed>/``; ``progress`` gets a line per finished job. The evaluations carry
    ``run`` and ``solved`` (the fp32 agent reaches its environment's threshold, :func:`solved_threshold`).
    """
    from rlq.rl.parallel import run_jobs

    missing = [spec.name for spec in specs if spec.name not in callbacks]
    if missing:
        raise ValueError(f"no QAT callbacks for runs {missing}; callbacks names {sorted(callbacks)}")
    pairs = [(spec, seed) for spec in specs for seed in seeds]
    jobs = [
        dict(
            spec=spec,
            seed=seed,
            callbacks=list(callbacks[spec.name]),
            calibration_steps=calibration_steps,
            folder=Path(out) / "agents" / spec.folder / f"seed{seed}",
            torch_threads=torch_threads,
            eval_episodes=eval_episodes,
            per_channel=per_channel,
            activations=activations,
            n_envs_on_policy=n_envs_on_policy,
            checkpoint_every=checkpoint_every,
        )
        for spec, seed in pairs
    ]

    def report(index: int, result: tuple[pd.DataFrame, pd.DataFrame]) -> None:
        if progress is not None:
            (spec, seed), table = pairs[index], result[0]
            cells = [
                f"{m} {b}: {r:.1f}"
                for m, b, r in zip(table.method, table.bits, table.mean_return, strict=True)
            ]
            progress(f"{spec.name} seed {seed}: " + ", ".join(cells))

    results = run_jobs(
        qat_seed, jobs, workers=workers, on_result=report, executor=executor, ray_address=ray_address
    )
    qat_table = pd.concat([r[0] for r in results], ignore_index=True)
    qat_table["run"] = qat_table["algorithm"] + " " + qat_table["environment"]
    fp32 = qat_table[qat_table.method == "fp32"].set_index(["run", "seed"])["mean_return"]
    thresholds = {env: solved_threshold(env)[0] for env in qat_table["environment"].unique()}
    qat_table["solved"] = [
        thresholds[env] is not None and fp32[(run, seed)] >= thresholds[env]
        for run, seed, env in zip(qat_table.run, qat_table.seed, qat_table.environment, strict=True)
    ]
    return qat_table, pd.concat([r[1] for r in results], ignore_index=True)


def mark_solved(qat_table: pd.DataFrame) -> pd.DataFrame:
    """Return the evaluations (fp32, PTQ and QAT per run, seed and bit width) with ``run`` and ``solved`` added.

    ``run`` is ``"<algorithm> <environment>"``; ``solved`` says whether the run's fp32 agent of that seed
    reaches its environment's threshold (:func:`solved_threshold`).
    """
    qat_table = qat_table.assign(run=qat_table["algorithm"] + " " + qat_table["environment"])
    fp32 = qat_table[qat_table.method == "fp32"].set_index(["run", "seed"])["mean_return"]
    thresholds = {env: solved_threshold(env)[0] for env in qat_table["environment"].unique()}
    qat_table["solved"] = [
        thresholds[env] is not None and fp32[(run, seed)] >= thresholds[env]
        for run, seed, env in zip(qat_table.run, qat_table.seed, qat_table.environment, strict=True)
    ]
    return qat_table


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


def qat_estimates(qat_table: pd.DataFrame, reps: int = 2000) -> dict[str, dict[str, Any]]:
    """Return per bit width the IQM over seeds and runs, with its 95% interval, of QAT's return minus PTQ's in % of fp32.

    Named ``qat_minus_ptq_reward_pct_<bits>bits`` (unit: % of the fp32 return; positive: QAT keeps more):
    every agent, solved in fp32 or not, since QAT and PTQ start from the same seed either way.
    """
    from rlq.experiments.quarl.ptq_sweep import seed_task_matrix
    from rlq.experiments.seed_statistics import estimate

    wide = qat_table.pivot_table(index=["run", "seed", "bits"], columns="method", values="mean_return")
    fp32 = qat_table[qat_table.method == "fp32"].set_index(["run", "seed"])["mean_return"]
    wide = wide.reset_index().query("bits != 32")
    wide = wide.assign(fp32=[fp32[(r, s)] for r, s in zip(wide.run, wide.seed, strict=True)])
    wide = wide[wide["fp32"] != 0]
    wide["gap_pct"] = 100 * (wide["qat"] - wide["ptq"]) / wide["fp32"].abs()
    return {
        f"qat_minus_ptq_reward_pct_{int(b)}bits": estimate(seed_task_matrix(g, "gap_pct"), reps=reps).as_dict(
            "%"
        )
        for b, g in wide.groupby("bits")
    }
