"""Which of our recorded numbers answers which paper number, and when the claim holds.

Each :class:`Claim` points at rows of ``data/paper/*.csv`` (paper, experiment, metric) and at the
experiment notebook whose ``results.json`` holds our number. ``rlq report`` walks this list. Keys are read
with today's method names, also from results published under an older name
(:func:`rlq.experiments.results.normalize_method_names`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlq.experiments.results import normalize_method_names

Results = dict[str, Any]


@dataclass(frozen=True)
class Claim:
    """A paper number, where ours comes from, and the test that says whether the paper's claim holds."""

    paper: str
    experiment: str
    metric: str
    ours_experiment: str
    ours: Callable[[Results], float | None]
    holds: Callable[[float, float], bool]
    rule: str
    """The test in words, e.g. ``ours >= paper - 5``."""
    setting: Callable[[Results], str | None] = lambda results: None
    """Why a run's number is not comparable (another data set, say), or None when it is."""


def _get(*keys: str) -> Callable[[Results], float | None]:
    def read(results: Results) -> float | None:
        value: Any = normalize_method_names(results)
        for key in keys:
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    return read


def _scaled(read: Callable[[Results], float | None], factor: float) -> Callable[[Results], float | None]:
    def scaled(results: Results) -> float | None:
        value = read(results)
        return None if value is None else value * factor

    return scaled


def _max_of(key: str) -> Callable[[Results], float | None]:
    def read(results: Results) -> float | None:
        values = normalize_method_names(results).get(key)
        if not isinstance(values, dict) or not values:
            return None
        numbers = [float(v) for v in values.values() if isinstance(v, (int, float))]
        return max(numbers) if numbers else None

    return read


def _cifar_only(results: Results) -> str | None:
    dataset = results.get("dataset")
    return None if dataset == "cifar10" else f"measured on {dataset or 'unknown data'}, not CIFAR-10"


def _gst_average_compression(experiment: str, notebook: str) -> Claim:
    """Return the claim that GST's average compression ratio reaches the paper's, to within 5 %p."""
    return Claim(
        "gst",
        experiment,
        "avg_compression_ratio",
        notebook,
        _scaled(_get("avg_compression_gst"), 100.0),
        lambda ours, paper: ours >= paper - 5.0,
        "ours >= paper - 5 %p",
    )


def _gst_reward_drop(experiment: str, notebook: str, measure: str) -> Claim:
    """Return the claim that GST's ``measure`` (reward, score) drops no further below dense than seed noise."""
    return Claim(
        "gst",
        experiment,
        "reward_drop",
        notebook,
        _get("reward_drop_beyond_seed_noise_pct"),
        lambda ours, paper: ours <= paper,
        f"GST's {measure} drop vs dense (%) beyond one pooled standard deviation over seeds <= paper's 0",
    )


CLAIMS: list[Claim] = [
    Claim(
        "gst",
        "td3_mujoco",
        "avg_compression_gain_vs_iterative_pruning_min",
        "gst_td3_mujoco",
        _get("gap_gst_minus_pruning_pp"),
        lambda ours, paper: ours >= paper,
        "GST minus iterative pruning, average compression (%p) >= paper's lower end",
    ),
    _gst_reward_drop("td3_mujoco", "gst_td3_mujoco", "reward"),
    _gst_average_compression("a2c_atari", "gst_a2c_atari"),
    _gst_reward_drop("a2c_atari", "gst_a2c_atari", "score"),
    _gst_average_compression("ppo_football", "gst_ppo_football"),
    Claim(
        "quarl",
        "actorq",
        "end_to_end_speedup_min",
        "quarl_actorq",
        _get("speedup_int8_vs_fp32"),
        lambda ours, paper: ours >= paper,
        "int8 vs fp32 actors, wall-clock to the return threshold >= paper",
    ),
    Claim(
        "quarl",
        "ptq",
        "int8_reward_drop",
        "quarl_ptq",
        _scaled(_get("worst_int8_relative_change"), -100.0),
        lambda ours, paper: ours <= 5.0,
        "worst int8 reward drop (%) <= 5",
    ),
    Claim(
        "quarl",
        "ptq",
        "enough_bits_max",
        "quarl_ptq",
        _max_of("lowest_bits_within_tolerance"),
        lambda ours, paper: ours <= paper,
        "lowest bit width within tolerance, worst run, <= paper",
    ),
    Claim(
        "gst",
        "cifar10",
        "compression_ratio",
        "gst_classification",
        _get("gst_final_compression"),  # recorded in percent
        lambda ours, paper: ours >= paper - 5.0,
        "ours >= paper - 5 %p",
        _cifar_only,
    ),
    Claim(
        "gst",
        "cifar10",
        "accuracy_drop_vs_dense",
        "gst_classification",
        _get("gst_accuracy_drop_vs_dense"),  # recorded in percentage points
        lambda ours, paper: ours <= paper + 1.0,
        "accuracy drop (%p) <= paper + 1",
        _cifar_only,
    ),
]
