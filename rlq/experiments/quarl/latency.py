"""QuaRL latency and size of policy networks (``quarl_latency``) per backend and precision, and headline numbers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from rlq.experiments.quarl.run_specs import Progress


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
    policies: Mapping[str, Any],
    *,
    batch_sizes: Sequence[int],
    repeats: int,
    rounds: int,
    threads: int,
    seed: int,
    progress: Progress = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return the latency of every policy's action path per backend and batch size, and its size per precision.

    ``policies`` maps a label to an SB3 policy the caller built (e.g. :func:`rlq.sb3.quantized.make_policy`);
    each is measured in interleaved rounds over its backends (fp32 and int8 PyTorch and ONNX Runtime,
    :func:`rlq.sb3.quantized.benchmark_action_network`). The latency table gains ``speedup_vs_torch_fp32``,
    measured side by side.
    """
    from rlq.sb3.quantized import benchmark_action_network, policy_sizes

    if not policies:
        raise ValueError("policies is empty: give at least one labelled policy")
    latency_tables, size_tables = [], []
    for label, policy in policies.items():
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
