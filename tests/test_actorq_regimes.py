"""ActorQ's regimes: a run's configuration per regime, seed and precision; measured speedup beside the cost model's; the paper curve."""

from __future__ import annotations

import numpy as np
import pytest

from rlq.actorq import ActorQConfig, ActorQConfigError, train
from rlq.actorq.cost_model import steady_steps_per_s
from rlq.analysis.quarl import (
    paper_setting_curve,
    regime_breakdown,
    regime_comparison,
    regime_estimates,
    regime_runs,
)
from rlq.analysis.quarl.regimes import regime_config

BASE = ActorQConfig(env_id="Pendulum-v1", algorithm="TD3", n_actors=1, learning_starts=200, update_period=20, eval_every=10,
            eval_episodes=1, torch_threads=1, backend="local", learner_steps=20, actor_backend="torch")  # fmt: skip
REGIMES = {
    "busy_learner": {"description": "many updates per step", "hidden_sizes": [64, 64], "batch_size": 64,
                     "samples_per_insert": 32.0},
    "light_learner": {"description": "few updates per step", "hidden_sizes": [64, 64], "batch_size": 32,
                      "samples_per_insert": 4.0},
}  # fmt: skip


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every regime, seed and precision trained as the quarl_actorq notebook's cell trains them."""
    out = tmp_path_factory.mktemp("regimes")
    configs = {
        (name, seed, p): regime_config(BASE, regime, seed, p, out / f"{name}_s{seed}_{p}")
        for name, regime in REGIMES.items()
        for seed in (0, 1)
        for p in ("fp32", "int8")
    }
    return {key: train(config) for key, config in configs.items()}


def test_one_run_per_regime_seed_and_precision(results):
    assert sorted(results) == sorted((r, s, p) for r in REGIMES for s in (0, 1) for p in ("fp32", "int8"))
    light = results[("light_learner", 1, "int8")]
    assert light.config.seed == 1 and light.config.batch_size == 32 and light.config.samples_per_insert == 4.0
    assert light.config.hidden_sizes == (64, 64) and light.config.actor_precision == "int8"
    assert light.learner_steps == 20
    # The same learner rate limit: 4 samples per insert at batch 32 is one update per 8 transitions.
    assert light.env_steps >= 200 + 20 * 8
    table = regime_runs(results, return_threshold=-1e9)
    assert len(table) == 8 and (table["steps_per_s"] > 0).all()
    # a threshold below any return: the untrained policy's evaluation meets it, so no run has a time to time
    assert table["time_to_threshold_s"].isna().all()
    learning = regime_runs(untrained_scoring(results, -2e9), return_threshold=-1e9)
    second = [r.history["wall_time_s"].iloc[1] for r in results.values()]
    assert learning["time_to_threshold_s"].tolist() == pytest.approx(
        second
    )  # reached at the first trained eval


def untrained_scoring(results, value: float):
    """``results`` with every run's first evaluation (its untrained policy's) replaced by ``value``."""
    import dataclasses

    def first_replaced(history):
        history = history.copy()
        history.loc[history.index[0], "eval_return"] = value
        return history

    return {key: dataclasses.replace(r, history=first_replaced(r.history)) for key, r in results.items()}


def test_the_time_to_a_return_counts_only_returns_after_the_untrained_evaluation():
    import pandas as pd

    from rlq.actorq.result import time_to_learned_return, time_to_return

    history = pd.DataFrame(
        {"wall_time_s": [0.1, 5.0, 9.0], "env_steps": [0, 100, 200], "eval_return": [600.0, 300.0, 700.0]}
    )
    assert time_to_return(history, 500.0) == 0.1  # the untrained policy already scores 600
    assert time_to_learned_return(history, 500.0) is None and time_to_learned_return(history, 650.0) == 9.0
    assert time_to_learned_return(history, 650.0, "env_steps") == 200
    assert (
        time_to_learned_return(history, 800.0) is None
        and time_to_learned_return(history.iloc[:0], 1.0) is None
    )


def test_comparison_matches_an_independent_computation(results):
    comparison = regime_comparison(results, return_threshold=-1e9)
    assert len(comparison) == 4 and set(comparison["layout"]) == {"serial"}
    row = comparison[(comparison.regime == "light_learner") & (comparison.seed == 0)].iloc[0]
    f32, q = results[("light_learner", 0, "fp32")], results[("light_learner", 0, "int8")]
    assert row.measured_speedup == pytest.approx(
        steady_steps_per_s(q.history) / steady_steps_per_s(f32.history)
    )

    # Serial layout by hand: each run's actor seconds per step plus the (shared) learner seconds per step.
    def actor(r):
        b, policy = r.breakdown, r.env_steps - 200
        timers = ("actor_inference", "actor_pull", "actor_deserialize", "actor_load", "actor_other")
        return b["actor_env_step"] / r.env_steps + sum(b[k] for k in timers) / policy

    def learner(r):
        b = r.breakdown
        update = (b["learner_sample"] + b["learner_update"]) / r.learner_steps
        return update, (b["learner_insert"] + b["broadcast"]) / r.env_steps

    (u32, d32), (uq, dq) = learner(f32), learner(q)
    per_step = (u32 + uq) / 2 * 4.0 / 32 + (d32 + dq) / 2
    expected = (actor(f32) + per_step) / (actor(q) + per_step)
    assert row.predicted_speedup == pytest.approx(expected, rel=1e-9)
    assert row.error_pct == pytest.approx(100 * (expected / row.measured_speedup - 1))
    assert row.bound_fp32 == row.bound_q == "serial"


def test_breakdown_is_each_part_s_seconds_over_the_regime_s_steps(results):
    table = regime_breakdown(results).set_index(["regime", "precision", "part"])
    assert len(table) == 2 * 2 * 4 and (table["ms_per_step"] >= 0).all()
    runs = [results[("busy_learner", seed, "int8")] for seed in (0, 1)]
    steps = sum(r.env_steps for r in runs)
    seconds = {
        "inference": sum(r.breakdown["actor_inference"] for r in runs),
        "environment": sum(r.breakdown["actor_env_step"] for r in runs),
        "communication": sum(r.breakdown["actor_pull"] + r.breakdown["actor_deserialize"] for r in runs),
        "model load": sum(r.breakdown["actor_load"] for r in runs),
    }
    for part, value in seconds.items():
        assert table.loc[("busy_learner", "int8", part), "ms_per_step"] == pytest.approx(1e3 * value / steps)
    assert table.loc[("busy_learner", "int8", "inference"), "engine"] == "torch-int8"
    assert table.loc[("busy_learner", "int8", "inference"), "ms_per_step"] > 0


def test_estimates_per_regime_and_measure(results):
    estimates = regime_estimates(regime_comparison(untrained_scoring(results, -2e9), return_threshold=-1e9))
    assert set(estimates["regime"]) == set(REGIMES)
    assert set(estimates["measure"]) == {"measured_speedup", "time_speedup", "predicted_speedup"}
    assert (estimates["n"] == 2).all()
    assert (estimates["lower"] <= estimates["value"] + 1e-12).all()
    assert (estimates["value"] <= estimates["upper"] + 1e-12).all()
    # A threshold nobody reaches leaves the time speedup out rather than recording NaN.
    unreached = regime_estimates(regime_comparison(results, return_threshold=1e9))
    assert "time_speedup" not in set(unreached["measure"])
    untrained = regime_estimates(regime_comparison(results, return_threshold=-1e9))  # met before training
    assert "time_speedup" not in set(untrained["measure"])


def test_paper_curve_uses_both_regimes(results):
    from rlq.actorq.cost_model import result_costs

    curve = paper_setting_curve(results, "light_learner", "busy_learner", [1, 1e6])
    assert list(curve["learner_factor"]) == [1.0, 1e6]
    # A learner a million times faster leaves the 4 actors (each on its own core) binding at both precisions:
    # the speedup is then the ratio of the light regime's mean actor costs per step.
    assert curve["bound_fp32"].iloc[-1] == curve["bound_q"].iloc[-1] == "actors"

    def mean_actor(p):
        return np.mean(
            [result_costs(results[("light_learner", s, p)]).actor_seconds_per_step for s in (0, 1)]
        )

    assert curve["speedup"].iloc[-1] == pytest.approx(mean_actor("fp32") / mean_actor("int8"))
    with pytest.raises(ValueError, match="no fp32 run of regime 'missing'"):
        paper_setting_curve(results, "missing", "busy_learner", [1])


def test_a_regime_s_configuration_is_the_base_with_its_overrides_and_a_bad_one_fails_when_built(tmp_path):
    config = regime_config(BASE, REGIMES["light_learner"], 3, "int8", tmp_path / "light")
    assert (config.seed, config.actor_precision, config.checkpoint_dir) == (
        3,
        "int8",
        str(tmp_path / "light"),
    )
    assert config.hidden_sizes == (64, 64) and config.batch_size == 32 and config.env_id == BASE.env_id
    with pytest.raises(ActorQConfigError, match="batch_size"):
        regime_config(BASE, {"batch_size": 0}, 0, "fp32", tmp_path / "bad")
    assert not any(tmp_path.iterdir())  # nothing was written
