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
