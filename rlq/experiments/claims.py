"""Which of our recorded numbers answers which paper number, and the one rule that says whether a claim holds.

Each :class:`Claim` points at rows of ``data/paper/*.csv`` (paper, experiment, metric) and at the
experiment notebook whose ``results.json`` holds our number. ``rlq report`` walks this list. Keys are read
with today's method names, also from results published under an older name
(:func:`rlq.experiments.results.normalize_method_names`).

**The rule (one for every claim).** A claim compares our estimate against a threshold derived from the
paper's number (``ours >= threshold`` or ``ours <= threshold``). Our estimate is an IQM over seeds with its
95% bootstrap interval (:mod:`rlq.experiments.stats`), recorded by the notebook under
``results["estimates"][claim.estimate]``. The claim

- **holds** when the whole interval lies on the claim's side of the threshold,
- **does not hold** when the whole interval lies on the other side,
- is **inconclusive** when the interval straddles the threshold, or when fewer than
  :data:`~rlq.experiments.stats.MIN_SEEDS` seeds stand behind it, or when the run recorded only a point
  value (results published before interval estimates existed).

Tolerances are part of each claim's threshold and stated in its ``rule``: "no reward drop" holds when the
drop of GST's return IQM below dense training's IQM stays within :data:`REWARD_TOLERANCE_PCT` % of the dense
IQM over the whole interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlq.experiments.results import normalize_method_names
from rlq.experiments.stats import MIN_SEEDS, Estimate

Results = dict[str, Any]

REWARD_TOLERANCE_PCT = 10.0
"""A reward (or score) drop of up to this many % of the reference counts as "no reward drop"."""

COMPRESSION_TOLERANCE_PP = 5.0
"""A compression ratio up to this many %p below the paper's still reproduces it."""

VERDICTS = ("holds", "does not hold", "inconclusive")

FAMILIES = ("GST compression", "GST reward", "GST classification", "QuaRL reward and bits", "ActorQ speedup")
"""Claim families: the report draws one figure per family, every claim in it in its own unit."""


@dataclass(frozen=True)
class Claim:
    """A paper number, where ours comes from, and the threshold our interval is judged against."""

    paper: str
    experiment: str
    metric: str
    ours_experiment: str
    estimate: str
    """Name of our estimate under ``results["estimates"]`` (value, lower, upper, n), in :attr:`unit`."""
    ours: Callable[[Results], float | None]
    """Reads a point value from results recorded before estimates existed (judged inconclusive)."""
    direction: str
    """``">="`` or ``"<="``: on which side of the threshold the claim holds."""
    threshold: Callable[[float], float]
    """The paper's number -> the threshold ours is compared against (tolerances included)."""
    rule: str
    """The test in words, e.g. ``ours >= paper - 5 %p``."""
    family: str
    unit: str
    setting: Callable[[Results], str | None] = lambda results: None
    """Why a run's number is not comparable (another data set, say), or None when it is."""
    needs_paper_setting: bool = False
    """When True, a run in another setting (:attr:`setting` says which) cannot decide the claim: its verdict
    is inconclusive, with what the rule says of that run as the reason (a CIFAR-10 claim measured on digits)."""

    def holds(self, ours: float, paper: float) -> bool:
        """Return whether the point value ``ours`` is on the claim's side of the threshold."""
        limit = self.threshold(paper)
        return ours >= limit if self.direction == ">=" else ours <= limit


@dataclass(frozen=True)
class Verdict:
    """Our estimate of a claim's number, its interval and seeds, and the verdict of the one rule."""

    value: float
    lower: float
    upper: float
    n: int | None
    verdict: str
    reason: str
    threshold: float
    setting: str | None = None


def our_estimate(claim: Claim, results: Results) -> tuple[Estimate, bool] | None:
    """Return our estimate for ``claim`` and whether it has an interval (False: a legacy point value), or None."""
    recorded = normalize_method_names(results).get("estimates") or {}
    if claim.estimate in recorded:
        estimate = Estimate.from_dict(recorded[claim.estimate])
        finite = all(math.isfinite(x) for x in (estimate.value, estimate.lower, estimate.upper))
        return (estimate, True) if finite else None  # NaN: nothing was measured (dense scored 0, no episode)
    value = claim.ours(results)
    if value is None or not math.isfinite(value):
        return None
    seeds = results.get("seeds")
    n = seeds if isinstance(seeds, int) and not isinstance(seeds, bool) else None
    return Estimate(value, value, value, n or 1), False


def judge(claim: Claim, results: Results, paper_value: float) -> Verdict | None:
    """Return the verdict of the module's rule on ``claim`` for a run's ``results``, or None without a number."""
    found = our_estimate(claim, results)
    if found is None:
        return None
    est, has_interval = found
    limit = claim.threshold(float(paper_value))
    inside = (est.lower >= limit) if claim.direction == ">=" else (est.upper <= limit)
    outside = (est.upper < limit) if claim.direction == ">=" else (est.lower > limit)
    span = f"{_fmt(est.lower)} to {_fmt(est.upper)}"
    if not has_interval:
        verdict, reason = "inconclusive", "point value only (no interval recorded)"
    elif est.n < MIN_SEEDS:
        verdict, reason = "inconclusive", f"{est.n} seed{'s' if est.n != 1 else ''} (< {MIN_SEEDS})"
    elif inside:
        verdict, reason = "holds", f"interval {span} {claim.direction} {_fmt(limit)}"
    elif outside:
        verdict, reason = "does not hold", f"interval {span} on the wrong side of {_fmt(limit)}"
    else:
        verdict, reason = "inconclusive", f"interval {span} straddles {_fmt(limit)}"
    setting = claim.setting(results)
    if claim.needs_paper_setting and setting is not None and verdict != "inconclusive":
        verdict, reason = (
            "inconclusive",
            f"not the paper's setting; on this run the rule says {verdict}: {reason}",
        )
    n = est.n if has_interval else (est.n if est.n > 1 else None)
    return Verdict(est.value, est.lower, est.upper, n, verdict, reason, limit, setting)


def _fmt(x: float) -> str:
    return f"{x + 0.0:.3g}"  # + 0.0: a drop of -0.0 reads 0


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


def _actorq_regime(results: Results) -> str | None:
    """Return which measured regime ActorQ's speedup comes from (the paper's learner ran on an accelerator)."""
    recorded = (results.get("estimates") or {}).get("speedup_int8_vs_fp32")
    if not isinstance(recorded, dict) or not recorded.get("regime"):
        return None
    description = recorded.get("description")
    return f"measured in the {recorded['regime']} regime" + (f": {description}" if description else "")


def _actorq_convergence(results: Results) -> str | None:
    """Return the convergence runs' setting (network and update ratio), which is not the paper's 2048x3 one."""
    config = results.get("convergence_setting")
    return f"measured with {config}" if config else None


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
        "avg_compression_gst_pct",
        _scaled(_get("avg_compression_gst"), 100.0),
        ">=",
        lambda paper: paper - COMPRESSION_TOLERANCE_PP,
        f"GST's average compression over training (IQM over seeds, %) >= paper - {COMPRESSION_TOLERANCE_PP:g} %p",
        "GST compression",
        "%",
    )


def _legacy_reward_drop(results: Results) -> float | None:
    """Return the drop beyond seed noise that results published before the interval estimates recorded."""
    value = results.get("reward_drop_beyond_seed_noise_pct")
    return float(value) if isinstance(value, (int, float)) else None


def _gst_reward_drop(experiment: str, notebook: str, measure: str) -> Claim:
    """Return the claim that GST's ``measure`` (reward, score) IQM stays within the tolerance of dense training's."""
    return Claim(
        "gst",
        experiment,
        "reward_drop",
        notebook,
        "reward_drop_gst_vs_dense_pct",
        _legacy_reward_drop,
        "<=",
        lambda paper: paper + REWARD_TOLERANCE_PCT,
        f"drop of GST's {measure} IQM below dense's, in % of dense's, <= paper + {REWARD_TOLERANCE_PCT:g}",
        "GST reward",
        "%",
    )


CLAIMS: list[Claim] = [
    Claim(
        "gst",
        "td3_mujoco",
        "avg_compression_gain_vs_iterative_pruning_min",
        "gst_td3_mujoco",
        "gap_gst_minus_pruning_pp",
        _get("gap_gst_minus_pruning_pp"),
        ">=",
        lambda paper: paper,
        "GST minus iterative pruning, average compression (IQM of per-seed gaps, %p) >= paper's lower end",
        "GST compression",
        "%p",
    ),
    _gst_reward_drop("td3_mujoco", "gst_td3_mujoco", "reward"),
    _gst_average_compression("a2c_atari", "gst_a2c_atari"),
    _gst_reward_drop("a2c_atari", "gst_a2c_atari", "score"),
    _gst_average_compression("ppo_football", "gst_ppo_football"),
    _gst_reward_drop("ppo_football", "gst_ppo_football", "score"),
    Claim(
        "quarl",
        "actorq",
        "end_to_end_speedup_min",
        "quarl_actorq",
        "speedup_int8_vs_fp32",
        _get("speedup_int8_vs_fp32"),
        ">=",
        lambda paper: paper,
        "int8 vs fp32 actors, end-to-end speedup (x; steady env steps/s in the regime named) >= paper's lower end",
        "ActorQ speedup",
        "x",
        _actorq_regime,
    ),
    Claim(
        "quarl",
        "actorq",
        "int8_final_return_change",
        "quarl_actorq",
        "int8_final_return_change_pct",
        lambda results: None,
        ">=",
        lambda paper: paper - REWARD_TOLERANCE_PCT,
        f"int8 actors keep the learning curve: final return change vs fp32 on the same seed (IQM over tasks and "
        f"seeds, %) >= paper - {REWARD_TOLERANCE_PCT:g}",
        "ActorQ speedup",
        "%",
        _actorq_convergence,
    ),
    Claim(
        "quarl",
        "actorq_walltime",
        "time_to_return_speedup",
        "quarl_actorq",
        "time_to_return_speedup_int8_vs_fp32",
        lambda results: None,
        ">=",
        lambda paper: paper - 0.5,
        "time to return: fp32's time over int8's to 90% of fp32's final return (IQM over seeds, x) >= paper - 0.5 "
        "(the paper's 1.5x lower end)",
        "ActorQ speedup",
        "x",
        _actorq_convergence,
    ),
    Claim(
        "quarl",
        "ptq",
        "int8_reward_drop",
        "quarl_ptq",
        "int8_reward_drop_pct",
        _scaled(_get("worst_int8_relative_change"), -100.0),
        "<=",
        lambda paper: paper + 5.0,
        "int8 return drop vs fp32 on solved agents (IQM over seeds and tasks, %) <= paper + 5",
        "QuaRL reward and bits",
        "%",
    ),
    Claim(
        "quarl",
        "ptq",
        "enough_bits_max",
        "quarl_ptq",
        "lowest_bits_within_tolerance",
        _max_of("lowest_bits_within_tolerance"),
        "<=",
        lambda paper: paper,
        "lowest weights-only bit width within tolerance on solved agents (IQM over seeds and tasks) <= paper",
        "QuaRL reward and bits",
        "bits",
    ),
    Claim(
        "gst",
        "cifar10",
        "compression_ratio",
        "gst_classification",
        "gst_final_compression_pct",
        _get("gst_final_compression"),  # recorded in percent
        ">=",
        lambda paper: paper - COMPRESSION_TOLERANCE_PP,
        f"GST's final compression (%) >= paper - {COMPRESSION_TOLERANCE_PP:g} %p",
        "GST classification",
        "%",
        _cifar_only,
        needs_paper_setting=True,
    ),
    Claim(
        "gst",
        "cifar10",
        "accuracy_drop_vs_dense",
        "gst_classification",
        "gst_accuracy_drop_pp",
        _get("gst_accuracy_drop_vs_dense"),  # recorded in percentage points
        "<=",
        lambda paper: paper + 1.0,
        "accuracy drop vs dense (IQM over seeds, %p) <= paper + 1",
        "GST classification",
        "%p",
        _cifar_only,
        needs_paper_setting=True,
    ),
]
