"""QuaRL experiments: the training, quantization and evaluation loops, tables and headline numbers of the QuaRL notebooks.

- Runs: :class:`RunSpec` reads a notebook's ``runs`` entries (algorithm, environment, steps, hyperparameters).
- PTQ (``quarl_ptq``): :func:`train_fp32_agents`, :func:`evaluate_ptq` (every precision of every agent, cached
  in the agent's folder so a resumed run does not evaluate again), :func:`ptq_summary`, :func:`ptq_numbers`.
- QAT (``quarl_qat``): :func:`ptq_after_training` (the fp32 agent and its PTQ evaluation), :func:`qat_agent`
  (one QAT agent), :func:`qat_vs_ptq` (both over every run, seed and bit width), :func:`qat_summary`,
  :func:`qat_vs_ptq_table`, :func:`qat_numbers`.
- Latency (``quarl_latency``): :func:`benchmark_networks`, :func:`stored_sizes`, :func:`latency_numbers`.
- ActorQ (``quarl_actorq``): :func:`train_actorq`, :func:`actorq_summary`, :func:`actor_breakdown`,
  :func:`learner_breakdown`, :func:`breakdown_table`, :func:`speedup`, :func:`actorq_numbers`.

Their figures are in :mod:`rlq.experiments.figures`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from rlq.rl.evaluate import EVAL_SEED_OFFSET

if TYPE_CHECKING:
    from rlq.actorq import ActorQResult
    from rlq.rl.agents import TrainedAgent
    from rlq.rl.evaluate import EvalResult

Progress = Callable[[str], Any] | None

ON_POLICY = ("A2C", "PPO")
"""Algorithms that collect with several environments at once (``n_envs_on_policy``); the others use one."""

CALIBRATION_SEED_OFFSET = 20_000
"""The rollout that calibrates a quantized policy of a run trained with ``seed`` is seeded ``seed +
CALIBRATION_SEED_OFFSET``: apart from the training and the evaluation episodes (:data:`EVAL_SEED_OFFSET`)."""


# --------------------------------------------------------------------------------------------------------
# Runs


@dataclass(frozen=True)
class RunSpec:
    """One entry of a QuaRL notebook's ``runs``: ``[algorithm, environment, training steps]`` and optional hyperparameters."""

    algorithm: str
    env_id: str
    steps: int
    hyperparams: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: Sequence[Any]) -> RunSpec:
        """Return the run ``[algorithm, environment, steps]`` or ``[algorithm, environment, steps, hyperparams]``."""
        if len(spec) not in (3, 4):
            raise ValueError(
                f"a run is [algorithm, environment, steps] and optionally hyperparameters, got {spec!r}"
            )
        return cls(str(spec[0]), str(spec[1]), int(spec[2]), dict(spec[3]) if len(spec) == 4 else {})

    @property
    def name(self) -> str:
        """Return the run's name in tables, e.g. ``"PPO CartPole-v1"``."""
        return f"{self.algorithm} {self.env_id}"

    @property
    def folder(self) -> str:
        """Return the run's folder name, e.g. ``"PPO_CartPole-v1"``."""
        return f"{self.algorithm}_{self.env_id.replace('/', '_')}"

    def n_envs(self, n_envs_on_policy: int) -> int:
        """Return how many environments the run trains with: ``n_envs_on_policy`` for A2C and PPO, else 1."""
        return n_envs_on_policy if self.algorithm in ON_POLICY else 1


def parse_runs(runs: Sequence[Sequence[Any]]) -> list[RunSpec]:
    """Return a notebook's ``runs`` parameter as :class:`RunSpec` objects."""
    return [RunSpec.parse(spec) for spec in runs]


# --------------------------------------------------------------------------------------------------------
# PTQ: trained fp32 agents at every precision


@dataclass
class AgentRun:
    """An fp32 agent trained for one :class:`RunSpec`, in its folder."""

    spec: RunSpec
    folder: Path
    trained: TrainedAgent


def ptq_precisions(bit_widths: Sequence[int]) -> list[str]:
    """Return the precisions a PTQ sweep evaluates: fp32, fp16, int8 (real kernels), then the simulated ``bit_widths``."""
    return ["fp32", "fp16", "int8", *[f"int{b}" for b in bit_widths if b != 8]]


def train_fp32_agents(
    specs: Sequence[RunSpec],
    *,
    seed: int,
    n_envs_on_policy: int,
    out: str | Path,
    checkpoint_every: int = 0,
    progress: Progress = None,
) -> dict[str, AgentRun]:
    """Return one fp32 agent per run (by :attr:`RunSpec.name`), each trained in ``out/agents/<run>/`` and resumable there."""
    from rlq.rl.agents import train_agent

    agents = {}
    for spec in specs:
        folder = Path(out) / "agents" / spec.folder
        trained = train_agent(
            spec.algorithm,
            spec.env_id,
            spec.steps,
            seed=seed,
            n_envs=spec.n_envs(n_envs_on_policy),
            hyperparams=spec.hyperparams,
            run_dir=folder,
            checkpoint_every=checkpoint_every,
        )
        agents[spec.name] = AgentRun(spec, folder, trained)
        if progress is not None:
            resumed = f" (resumed from {trained.resumed_from})" if trained.resumed_from else ""
            progress(
                f"{spec.name}: {trained.model.num_timesteps} steps in {trained.wall_time_s:.0f} s{resumed}"
            )
    return agents


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


# --------------------------------------------------------------------------------------------------------
# QAT against PTQ


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
    from rlq.rl.agents import train_agent
    from rlq.sb3.quantized import collect_observations, evaluate_precisions

    fp32 = train_agent(
        spec.algorithm,
        spec.env_id,
        spec.steps,
        seed=seed,
        n_envs=spec.n_envs(n_envs_on_policy),
        hyperparams=spec.hyperparams,
        run_dir=Path(folder) / "fp32",
        checkpoint_every=checkpoint_every,
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
    from rlq.rl.agents import train_agent
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
    trained = train_agent(
        spec.algorithm,
        spec.env_id,
        spec.steps,
        seed=seed,
        n_envs=spec.n_envs(n_envs_on_policy),
        hyperparams=spec.hyperparams,
        run_dir=Path(folder) / f"qat{bits}",
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


# --------------------------------------------------------------------------------------------------------
# Latency and size of policy networks


def network_spaces(algorithm: str, obs_shape: Sequence[int], n_actions: int) -> tuple[Any, Any, str]:
    """Return the observation space, action space and SB3 policy kind of a network: a 3-d shape means uint8 frames and a CNN."""
    from gymnasium import spaces

    if len(obs_shape) == 3:
        obs_space, kind = spaces.Box(0, 255, tuple(obs_shape), np.uint8), "CnnPolicy"
    else:
        obs_space, kind = spaces.Box(-np.inf, np.inf, tuple(obs_shape), np.float32), "MlpPolicy"
    if algorithm in ("TD3", "DDPG", "SAC"):
        action_space = spaces.Box(-1.0, 1.0, (n_actions,), np.float32)
    else:
        action_space = spaces.Discrete(n_actions)
    return obs_space, action_space, kind


def benchmark_networks(
    networks: Sequence[Sequence[Any]],
    *,
    batch_sizes: Sequence[int],
    repeats: int,
    rounds: int,
    threads: int,
    seed: int,
    progress: Progress = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return the latency of every network's action path per backend and batch size, and its size per precision.

    ``networks`` holds ``[label, algorithm, observation shape, actions, hidden layers]`` entries; each policy is
    built from its spaces with random weights (:func:`rlq.sb3.quantized.make_policy`) and measured in
    interleaved rounds (:func:`rlq.sb3.quantized.benchmark_action_network`). The latency table gains
    ``speedup_vs_torch_fp32``, measured side by side.
    """
    from rlq.sb3.quantized import benchmark_action_network, make_policy, policy_sizes

    latency_tables, size_tables = [], []
    for label, algorithm, obs_shape, n_actions, hidden in networks:
        obs_space, action_space, kind = network_spaces(algorithm, obs_shape, n_actions)
        kwargs = {"net_arch": hidden} if kind == "MlpPolicy" else {}
        policy = make_policy(algorithm, obs_space, action_space, kind, seed=seed, **kwargs)
        table = benchmark_action_network(
            policy, batch_sizes=batch_sizes, repeats=repeats, rounds=rounds, threads=threads, seed=seed
        )
        latency_tables.append(table.assign(network=label))
        size_tables.append(policy_sizes(policy).assign(network=label))
        if progress is not None:
            one = table[table.batch_size == min(batch_sizes)].set_index("backend")["median_us"]
            progress(f"{label}: " + ", ".join(f"{b} {t:.0f} us" for b, t in one.items()))
    latency = pd.concat(latency_tables, ignore_index=True)
    reference = latency[latency.backend == "torch-fp32"].set_index(["network", "batch_size"])["median_us"]
    latency["speedup_vs_torch_fp32"] = [
        reference[(n, b)] / t
        for n, b, t in zip(latency.network, latency.batch_size, latency.median_us, strict=True)
    ]
    return latency, pd.concat(size_tables, ignore_index=True)


STORED_PRECISIONS = ("fp32", "fp16", "int8", "int4", "int2")
"""Precisions whose serialized weights the latency notebook compares."""


def stored_sizes(sizes: pd.DataFrame) -> pd.DataFrame:
    """Return each network's serialized weights in bytes, one column per precision of :data:`STORED_PRECISIONS`."""
    return sizes.pivot(index="network", columns="precision", values="size_bytes")[list(STORED_PRECISIONS)]


def size_table(latency: pd.DataFrame, sizes: pd.DataFrame) -> pd.DataFrame:
    """Return each network's stored weights per precision and model file per backend, in KiB."""
    files = latency.drop_duplicates(["network", "backend"]).pivot(
        index="network", columns="backend", values="size_bytes"
    )
    table = pd.concat([stored_sizes(sizes).add_prefix("stored "), files.add_prefix("model ")], axis=1) / 1024
    return table.rename(columns=lambda c: c + " (KiB)")


def batch1_speedups(latency: pd.DataFrame) -> pd.Series:
    """Return the speedup over PyTorch fp32 at the smallest batch, indexed by (network, backend)."""
    return latency[latency.batch_size == latency.batch_size.min()].set_index(["network", "backend"])[
        "speedup_vs_torch_fp32"
    ]


def latency_claim_lines(latency: pd.DataFrame, sizes: pd.DataFrame, breakdown: pd.Series) -> list[str]:
    """Return QuaRL's actor step and pull times (``breakdown``, by metric) and our batch-1 int8 speedups, one line each."""
    one, stored = batch1_speedups(latency), stored_sizes(sizes)
    lines = [
        f"QuaRL: actor step {breakdown['step_seconds_fp32']:.1f} s fp32 vs {breakdown['step_seconds_int8']:.1f} s int8 "
        f"({breakdown['step_seconds_fp32'] / breakdown['step_seconds_int8']:.1f}x), pull "
        f"{breakdown['pull_seconds_fp32']:.2f} s vs {breakdown['pull_seconds_int8']:.2f} s"
    ]
    for network in latency.network.unique():
        lines.append(
            f"ours, {network}: torch int8 {one[(network, 'torch-int8')]:.2f}x, "
            f"ONNX int8 {one[(network, 'onnx-int8')]:.2f}x torch fp32; int8 weights "
            f"{stored.loc[network, 'int8'] / stored.loc[network, 'fp32']:.0%} of fp32"
        )
    return lines


def latency_numbers(latency: pd.DataFrame, sizes: pd.DataFrame) -> dict[str, Any]:
    """Return a latency run's headline numbers: batch-1 speedups over PyTorch fp32 per backend, int8's size fraction."""
    one, stored = batch1_speedups(latency), stored_sizes(sizes)
    networks = latency.network.unique()
    return {
        "torch_int8_speedup_batch1": {n: one[(n, "torch-int8")] for n in networks},
        "onnx_int8_speedup_batch1": {n: one[(n, "onnx-int8")] for n in networks},
        "onnx_fp32_speedup_batch1": {n: one[(n, "onnx-fp32")] for n in networks},
        "int8_size_fraction": {n: stored.loc[n, "int8"] / stored.loc[n, "fp32"] for n in stored.index},
    }


# --------------------------------------------------------------------------------------------------------
# ActorQ: the same learner with actors at each precision

ACTOR_PARTS = {
    "step": ("actor_env_step", "actor_inference"),
    "pull": ("actor_pull",),
    "deserialize": ("actor_deserialize",),
    "load": ("actor_load",),
}
"""The paper's categories of actor time (step = environment + inference), each as ActorQ's timers."""

LEARNER_PARTS = ("learner_update", "learner_sample", "learner_insert", "broadcast", "learner_wait")
"""Where the learner's process spends its time."""


def task_name(env_id: str) -> str:
    """Return a DeepMind Control task's short name: ``"dm_control/cartpole-balance-v0"`` gives ``"cartpole-balance"``."""
    return env_id.split("/")[-1].removesuffix("-v0")


ActorQResults = dict[tuple[str, str], "ActorQResult"]


def train_actorq(
    env_ids: Sequence[str],
    precisions: Sequence[str],
    *,
    out: str | Path,
    backend: str,
    hidden_sizes: Sequence[int],
    critic_hidden_sizes: Sequence[int],
    hyperparams: dict[str, Any],
    progress: Progress = None,
    **config: Any,
) -> ActorQResults:
    """Return one ActorQ run per task and actor precision, by ``(env_id, precision)``, each resumable from its checkpoints.

    Every run has the same learner, seed and ``config`` (:class:`rlq.actorq.ActorQConfig` fields); only the
    actors' precision changes. Checkpoints go to ``out/checkpoints/<task>_<precision>``; with the Ray
    ``backend`` all runs share one Ray instance. ``progress`` gets a line per run.
    """
    from rlq.actorq import ActorQConfig, ray_session, train

    results: ActorQResults = {}
    with ray_session() if backend == "ray" else contextlib.nullcontext():
        for env_id in env_ids:
            for precision in precisions:
                result = train(
                    ActorQConfig(
                        env_id=env_id,
                        actor_precision=precision,
                        backend=backend,
                        hidden_sizes=tuple(hidden_sizes),
                        critic_hidden_sizes=tuple(critic_hidden_sizes),
                        hyperparams=dict(hyperparams),
                        checkpoint_dir=str(Path(out) / "checkpoints" / f"{task_name(env_id)}_{precision}"),
                        **config,
                    )
                )
                results[(env_id, precision)] = result
                if progress is not None:
                    progress(
                        f"{task_name(env_id):>16} {precision}: {result.learner_steps} learner steps, "
                        f"{result.env_steps} env steps, {result.wall_time_s:.1f} s training, actors on "
                        f"{result.actor_backend} at {result.actor_steps_per_s:.0f} steps/s, final return "
                        f"{result.history['eval_return'].iloc[-1]:.0f}"
                    )
    return results


def actorq_curves(results: ActorQResults) -> pd.DataFrame:
    """Return every run's evaluations over training, stacked, with ``task`` and ``precision`` columns."""
    return pd.concat(
        [r.history.assign(task=task_name(e), precision=p) for (e, p), r in results.items()], ignore_index=True
    )


def actor_breakdown(results: ActorQResults) -> pd.DataFrame:
    """Return the actors' seconds per 1000 steps in each of :data:`ACTOR_PARTS`, summed over tasks, per precision."""
    rows = []
    for precision in dict.fromkeys(p for _, p in results):
        runs = [r for (_, p), r in results.items() if p == precision]
        steps = sum(r.env_steps for r in runs)
        for part, keys in ACTOR_PARTS.items():
            seconds = sum(r.breakdown[k] for r in runs for k in keys)
            rows.append(
                dict(precision=precision, part=part, seconds_per_1000_steps=1000 * seconds / max(steps, 1))
            )
    return pd.DataFrame(rows)


def learner_breakdown(results: ActorQResults, backend: str) -> pd.DataFrame:
    """Return the learner process's seconds in each of :data:`LEARNER_PARTS` per precision (and, local, its actors')."""
    precisions = list(dict.fromkeys(p for _, p in results))
    rows = [
        dict(precision=p, part=k, seconds=sum(r.breakdown[k] for (_, q), r in results.items() if q == p))
        for p in precisions
        for k in LEARNER_PARTS
    ]
    if backend == "local":  # the actors ran in the learner's process, between its updates
        rows += [
            dict(
                precision=p,
                part="actors (in process)",
                seconds=sum(
                    v
                    for (_, q), r in results.items()
                    if q == p
                    for k, v in r.breakdown.items()
                    if k.startswith("actor_")
                ),
            )
            for p in precisions
        ]
    return pd.DataFrame(rows)


def breakdown_table(results: ActorQResults) -> pd.DataFrame:
    """Return every run's seconds per component (every timer of :data:`rlq.actorq.BREAKDOWN_KEYS`), one row each."""
    return pd.DataFrame(
        [
            dict(task=task_name(e), precision=p, component=k, seconds=v)
            for (e, p), r in results.items()
            for k, v in r.breakdown.items()
        ]
    )


def component_shares(breakdown: pd.DataFrame) -> pd.DataFrame:
    """Return each component's share of all seconds per precision, from :func:`breakdown_table` (summed over tasks)."""
    seconds = breakdown.pivot_table(index="component", columns="precision", values="seconds", aggfunc="sum")
    return seconds / seconds.sum()


def paper_breakdown() -> pd.DataFrame:
    """Return QuaRL's runtime breakdown (seconds, update period 30) with ``part`` and ``precision`` columns."""
    from rlq.experiments.paper import paper_numbers

    paper = paper_numbers("quarl", experiment="actorq_breakdown")
    return paper.assign(
        part=paper["metric"].str.split("_").str[0], precision=paper["metric"].str.split("_").str[-1]
    )


def actorq_summary(results: ActorQResults, return_threshold: float) -> pd.DataFrame:
    """Return one row per task and precision: bytes per broadcast, actor steps/s, engine, time to the threshold, final return."""
    return pd.DataFrame(
        [
            dict(
                task=task_name(e),
                precision=p,
                bytes_per_broadcast=r.bytes_per_broadcast,
                actor_steps_per_s=r.actor_steps_per_s,
                engine=r.actor_backend,
                time_to_threshold_s=r.time_to_return(return_threshold),
                wall_time_s=r.wall_time_s,
                final_return=float(r.history["eval_return"].iloc[-1]),
            )
            for (e, p), r in results.items()
        ]
    )


def speedup(results: ActorQResults, precision: str, return_threshold: float) -> float | None:
    """Return the wall-clock speedup to ``return_threshold`` of ``precision`` actors over fp32 actors.

    The geometric mean over the tasks where both reached the threshold; None where none did, or where
    either precision was not run.
    """
    ratios = []
    for env_id in dict.fromkeys(e for e, _ in results):
        if (env_id, "fp32") not in results or (env_id, precision) not in results:
            continue
        t_ref = results[(env_id, "fp32")].time_to_return(return_threshold)
        t_other = results[(env_id, precision)].time_to_return(return_threshold)
        if t_ref is not None and t_other is not None and t_other > 0:
            ratios.append(t_ref / t_other)
    return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None


def actor_breakdown_shares(results: ActorQResults) -> dict[str, dict[str, float]]:
    """Return each :data:`ACTOR_PARTS` part's share of the actors' time, summed over tasks, per precision."""
    shares = {}
    for precision in dict.fromkeys(p for _, p in results):
        runs = [r for (_, p), r in results.items() if p == precision]
        totals = {part: sum(r.breakdown[k] for r in runs for k in keys) for part, keys in ACTOR_PARTS.items()}
        all_actor = sum(totals.values())
        shares[precision] = {part: (v / all_actor if all_actor else 0.0) for part, v in totals.items()}
    return shares


def actorq_numbers(results: ActorQResults, summary: pd.DataFrame, return_threshold: float) -> dict[str, Any]:
    """Return an ActorQ run's headline numbers: speedups over fp32 actors, actor throughput, broadcast bytes, shares, returns."""
    precisions = list(dict.fromkeys(p for _, p in results))
    first_task = summary["task"].iloc[0]
    first = summary[summary["task"] == first_task]
    return {
        "speedup_int8_vs_fp32": speedup(results, "int8", return_threshold)
        if {"int8", "fp32"} <= set(precisions)
        else None,
        "speedup_fp16_vs_fp32": speedup(results, "fp16", return_threshold)
        if {"fp16", "fp32"} <= set(precisions)
        else None,
        "actor_steps_per_s": {
            p: float(summary[summary["precision"] == p]["actor_steps_per_s"].mean()) for p in precisions
        },
        "bytes_per_broadcast": {
            p: int(first[first["precision"] == p]["bytes_per_broadcast"].iloc[0]) for p in precisions
        },
        "actor_breakdown_shares": actor_breakdown_shares(results),
        "final_return": {
            f"{task_name(e)}/{p}": float(r.history["eval_return"].iloc[-1]) for (e, p), r in results.items()
        },
        "time_to_threshold_s": {
            f"{task_name(e)}/{p}": r.time_to_return(return_threshold) for (e, p), r in results.items()
        },
        "actor_engine": {p: r.actor_backend for (e, p), r in results.items() if task_name(e) == first_task},
    }
