"""QuaRL post-training quantization (``quarl_ptq``): every (run, seed) agent at every precision, beside a noise control.

Per agent, on the same seeded episodes: fp32 and fp16; **int8 with real kernels** (``scheme`` ``"kernel"``:
dynamic quantization quantizes the activations per batch too, static quantization calibrated ones); the
**weights-only** simulated sweep (``"weights-only"``, 8 bits included, so that the sweep compares like with
like); ONNX Runtime fp32 and int8 (``"onnx"``); and the **matched noise control** (``"noise"``): the fp32
weights plus uniform noise of plus or minus half a quantization step at each width, several draws
(:func:`rlq.quant.perturb_weights`). A width whose noise draws break the agent as often as quantization does
shows a fragile agent, not a bad quantizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlq.experiments.quarl.evaluation import evaluate_episodes, solved_threshold
from rlq.experiments.quarl.run_specs import CALIBRATION_SEED_OFFSET, Progress, RunSpec
from rlq.rl.evaluate import EVAL_SEED_OFFSET
from rlq.sb3.quantized import weights_only

FLOAT, KERNEL, WEIGHTS_ONLY, ONNX, NOISE = "float", "kernel", "weights-only", "onnx", "noise"
"""The ``scheme`` of a row: float casts, torch int8 kernels (weights and activations), simulated weights-only
integers, ONNX Runtime, and fp32 weights plus matched uniform noise."""
SCHEMES = (FLOAT, KERNEL, WEIGHTS_ONLY, ONNX, NOISE)

NOISE_SEED_OFFSET = 30_000
"""Noise draw ``d`` at ``bits`` of the agent trained with ``seed`` is seeded
``seed + NOISE_SEED_OFFSET + 100 * bits + d``: apart from training, evaluation and calibration seeds."""

PTQ_CACHE = "ptq.csv"
"""An agent's evaluation at every precision, in its folder: a resumed run reads it instead of evaluating again."""

COLUMNS = ["precision", "scheme", "bits", "backend", "draw", "mean_return", "std_return", "size_bytes"]


@dataclass(frozen=True)
class Quantizer:
    """One precision a PTQ sweep evaluates every agent at: :func:`rlq.quant.ptq` of its action path.

    Calling it with a trained SB3 model returns the quantized policy that acts (through
    :func:`rlq.sb3.quantized.quantized_policy`, which applies ``ptq`` to the features extractor, MLP and action
    head and gives it SB3's ``predict``). ``scheme``: ``"float"`` (fp32, fp16), ``"kernel"`` (int8 with real
    integer kernels: dynamic for MLP policies, static calibrated for CNNs), ``"weights-only"`` (simulated
    integer weights; :func:`weights_only` names the width), ``"onnx"`` (ONNX Runtime, fp32 or int8) or
    ``"noise"``: the fp32 weights plus uniform noise of half a quantization step at the precision's width
    (:func:`rlq.quant.perturb_weights`), draw ``draw``. ``per_channel_linear``: one scale per output channel
    in linear layers too (QuaRL used one per tensor).
    """

    precision: str
    scheme: str = FLOAT
    per_channel_linear: bool = False
    draw: int = 0

    def __post_init__(self) -> None:
        from rlq.quant import parse_precision

        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {self.scheme!r}")
        parse_precision(self.precision)  # names the precision when it is unknown

    @property
    def bits(self) -> int:
        """Return the precision's width in bits."""
        from rlq.quant import parse_precision

        return parse_precision(self.precision).bits

    @property
    def backend(self) -> str:
        """Return where the policy runs: ``"onnx"`` (ONNX Runtime) or ``"torch"``."""
        return "onnx" if self.scheme == ONNX else "torch"

    def __call__(self, model: Any, calibration: Any = None, seed: int = 0) -> Any:
        """Return ``model``'s quantized policy (a noise draw is seeded from the agent's ``seed``)."""
        from rlq.sb3.quantized import quantized_policy

        if self.scheme == ONNX:
            return quantized_policy(model, self.precision, calibration, "onnx")
        if self.scheme != NOISE:
            return quantized_policy(
                model, self.precision, calibration, per_channel_linear=self.per_channel_linear
            )
        from rlq.quant import perturb_weights

        policy = quantized_policy(model, "fp32")  # an eval-mode copy of the action path, perturbed below
        noise_seed = int(seed + NOISE_SEED_OFFSET + 100 * self.bits + self.draw)
        policy.network = perturb_weights(
            policy.network, self.bits, seed=noise_seed, per_channel_linear=self.per_channel_linear
        )
        policy.precision = self.precision
        return policy


def evaluate_agent(
    model: Any,
    env_id: str,
    quantizers: Sequence[Quantizer],
    *,
    seed: int,
    eval_episodes: int,
    calibration_steps: int,
) -> pd.DataFrame:
    """Return one agent's return under every quantizer, on the same episodes, beside a random policy's.

    Episodes are seeded ``seed +`` :data:`EVAL_SEED_OFFSET`; static int8 is calibrated on
    ``calibration_steps`` observations of the fp32 agent's own rollout. ``quantizers`` must hold fp32 under
    the ``"float"`` scheme, the reference of ``relative_change``. Columns: :data:`COLUMNS`,
    ``relative_change`` (against fp32), ``random_return``.
    """
    from rlq.rl.evaluate import random_policy
    from rlq.sb3.quantized import collect_observations

    if not any(q.precision == "fp32" and q.scheme == FLOAT for q in quantizers):
        raise ValueError("quantizers must include Quantizer('fp32'), the reference of every relative change")
    eval_seed = seed + EVAL_SEED_OFFSET
    calibration = collect_observations(
        env_id, calibration_steps, model=model, seed=seed + CALIBRATION_SEED_OFFSET
    )
    rows = []
    for q in quantizers:
        policy = q(model, calibration, seed)
        result = evaluate_episodes(policy, env_id, eval_episodes, eval_seed)
        rows.append(
            (q.precision, q.scheme, q.bits, q.backend, q.draw, result.mean, result.std, policy.size_bytes)
        )
    table = pd.DataFrame(rows, columns=COLUMNS)
    fp32 = table.loc[(table.precision == "fp32") & (table.scheme == FLOAT), "mean_return"].iloc[0]
    table["relative_change"] = (table["mean_return"] - fp32) / abs(fp32) if fp32 != 0 else np.nan
    floor = evaluate_episodes(random_policy(env_id, seed), env_id, eval_episodes, eval_seed).mean
    table["random_return"] = floor
    return table


def ptq_agent(
    spec: RunSpec,
    seed: int,
    quantizers: Sequence[Quantizer],
    *,
    folder: str | Path,
    n_envs_on_policy: int,
    checkpoint_every: int,
    torch_threads: int = 1,
    **evaluation: Any,
) -> pd.DataFrame:
    """Return :func:`evaluate_agent`'s table for the agent of ``spec`` and ``seed``, trained (or resumed) in ``folder``.

    The table is cached as :data:`PTQ_CACHE` in ``folder``: a resumed run reads it back and neither trains nor
    evaluates again. One job of :func:`evaluate_ptq` (picklable, for worker processes).
    """
    import torch

    torch.set_num_threads(torch_threads)
    folder = Path(folder)
    cached = folder / PTQ_CACHE
    if cached.exists():
        return pd.read_csv(cached)
    trained = spec.train(
        folder, seed=seed, n_envs_on_policy=n_envs_on_policy, checkpoint_every=checkpoint_every
    )
    table = evaluate_agent(trained.model, spec.env_id, quantizers, seed=seed, **evaluation)
    table.insert(0, "train_wall_s", trained.wall_time_s)
    table.insert(0, "train_steps", trained.model.num_timesteps)
    table.insert(0, "seed", seed)
    table.insert(0, "environment", spec.env_id)
    table.insert(0, "algorithm", spec.algorithm)
    table.to_csv(cached, index=False)
    return table


def evaluate_ptq(
    specs: Sequence[RunSpec],
    seeds: Sequence[int],
    quantizers: Sequence[Quantizer],
    *,
    out: str | Path,
    workers: int = 1,
    executor: str = "processes",
    ray_address: str | None = None,
    progress: Progress = None,
    **job: Any,
) -> pd.DataFrame:
    """Return :func:`ptq_agent`'s tables of every run and seed, each agent under every one of ``quantizers``, stacked.

    With ``run``, ``solved`` and ``normalised_score`` columns.

    Agents train in ``out/agents/<run>/seed<seed>/``, ``workers`` at a time in processes or Ray tasks
    (``executor``, ``ray_address``: :func:`rlq.rl.parallel.run_jobs`).
    ``solved``: the agent's fp32 return reaches its environment's threshold
    (:func:`~rlq.experiments.quarl.evaluation.solved_threshold`). The normalised score is
    ``(return - random) / (fp32 - random)``: 1 is the fp32 agent, 0 is chance.
    """
    from rlq.rl.parallel import run_jobs

    pairs = [(spec, seed) for spec in specs for seed in seeds]
    jobs = [
        dict(
            spec=spec,
            seed=seed,
            quantizers=list(quantizers),
            folder=Path(out) / "agents" / spec.folder / f"seed{seed}",
            **job,
        )  # fmt: skip
        for spec, seed in pairs
    ]

    def report(index: int, table: pd.DataFrame) -> None:
        if progress is not None:
            spec, seed = pairs[index]
            fp32 = table.loc[table.precision.eq("fp32") & table.scheme.eq(FLOAT), "mean_return"].iloc[0]
            steps, wall = table["train_steps"].iloc[0], table["train_wall_s"].iloc[0]
            progress(f"{spec.name} seed {seed}: {steps} steps in {wall:.0f} s, fp32 return {fp32:.1f}")

    tables = run_jobs(
        ptq_agent, jobs, workers=workers, on_result=report, executor=executor, ray_address=ray_address
    )
    ptq = pd.concat(tables, ignore_index=True)
    ptq["run"] = ptq["algorithm"] + " " + ptq["environment"]
    fp32 = ptq[ptq.precision.eq("fp32") & ptq.scheme.eq(FLOAT)].set_index(["run", "seed"])["mean_return"]
    fp32_of = pd.Series([fp32.get((r, s)) for r, s in zip(ptq.run, ptq.seed, strict=True)], index=ptq.index)
    ptq["normalised_score"] = (ptq["mean_return"] - ptq["random_return"]) / (fp32_of - ptq["random_return"])
    thresholds = {env: solved_threshold(env)[0] for env in ptq["environment"].unique()}
    threshold = ptq["environment"].map(thresholds)
    ptq["solved_threshold"] = threshold
    ptq["solved"] = threshold.notna() & (fp32_of >= threshold.fillna(np.inf))
    return ptq


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
    from rlq.experiments.seed_statistics import estimate

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
    from rlq.experiments.seed_statistics import interval_estimates

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
