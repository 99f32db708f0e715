"""ActorQ's convergence section: thresholds, times to return, pairing by seed and return at equal steps."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from rlq.analysis.quarl import convergence


def run(returns, seconds_per_eval, steps_per_eval=1000):
    n = len(returns)
    history = pd.DataFrame({
        "wall_time_s": np.arange(n) * seconds_per_eval, "env_steps": np.arange(n) * steps_per_eval,
        "learner_steps": np.arange(n) * 10, "eval_return": returns, "actor_saturated_share": 0.0,
    })  # fmt: skip
    return SimpleNamespace(
        history=history, env_steps=(n - 1) * steps_per_eval, wall_time_s=(n - 1) * seconds_per_eval
    )


def results():
    # fp32 ends at 1000 on every seed: threshold 900, reached at eval 3 (fp32, 10 s apart) and eval 2 (int8, 5 s apart)
    out = {}
    for seed in (0, 1, 2):
        out[("balance", seed, "fp32")] = run([100, 500, 800, 950, 1000], 10.0)
        out[("balance", seed, "int8")] = run([100, 600, 920, 990, 980 - seed], 5.0)
    return out


def test_runs_threshold_times_and_beating_the_initial_policy():
    runs = convergence.convergence_runs(results(), fraction=0.9)
    assert (runs["threshold"] == 900.0).all()
    fp32, int8 = runs[runs["precision"] == "fp32"], runs[runs["precision"] == "int8"]
    assert (fp32["time_to_threshold_s"] == 30.0).all() and (fp32["steps_to_threshold"] == 3000).all()
    assert (int8["time_to_threshold_s"] == 10.0).all() and (int8["steps_to_threshold"] == 2000).all()
    assert runs["beats_initial"].all()
    never = convergence.convergence_runs({**results(), ("balance", 0, "int8"): run([100, 200, 300], 5.0)})
    row = never[(never["seed"] == 0) & (never["precision"] == "int8")].iloc[0]
    assert np.isnan(row["time_to_threshold_s"]) and bool(row["beats_initial"])


def test_estimates_pair_seeds_and_the_numbers_name_the_claims():
    runs = convergence.convergence_runs(results())
    table = convergence.convergence_estimates(runs)
    by = {(r.task, r.measure): r for r in table.itertuples()}
    assert by[("balance", "time_ratio")].value == pytest.approx(3.0) and by[("balance", "time_ratio")].n == 3
    changes = [100.0 * (980 - s - 1000) / 1000 for s in (0, 1, 2)]  # -2, -2.1, -2.2 %: IQM of 3 is their mean
    assert by[("all", "final_return_change_pct")].value == pytest.approx(np.mean(changes))
    assert (
        by[("all", "final_return_change_pct")].lower <= -2.1 <= by[("all", "final_return_change_pct")].upper
    )
    numbers = convergence.convergence_numbers(table, runs, "balance", 0.9)
    assert numbers["estimates"]["time_to_return_speedup_int8_vs_fp32"]["value"] == pytest.approx(3.0)
    assert numbers["estimates"]["int8_final_return_change_pct"]["n"] == 3
    assert numbers["convergence_runs_above_initial"] == "6 of 6"
    with pytest.raises(ValueError, match="time_task"):
        convergence.convergence_numbers(table, runs, "walker", 0.9)


def test_return_at_equal_steps_interpolates_each_run():
    curves = convergence.convergence_curves(results())
    at = convergence.return_at(curves, "env_steps", points=4)
    fp32 = at[at["precision"] == "fp32"]
    assert list(fp32["env_steps"]) == [1000, 2000, 3000, 4000]
    assert list(fp32["value"]) == [500.0, 800.0, 950.0, 1000.0]
    int8_mid = at[(at["precision"] == "int8") & (at["env_steps"] == 4000)].iloc[0]
    assert int8_mid["value"] == pytest.approx(979.0) and int8_mid["n"] == 3
    by_time = convergence.return_at(
        curves, "wall_time_s", points=2
    )  # int8 runs end at 20 s: points 10 and 20
    assert list(by_time[by_time["precision"] == "fp32"]["value"]) == [500.0, 800.0]
    with pytest.raises(ValueError, match="no fp32 run"):
        convergence.convergence_runs({("x", 0, "int8"): run([1, 2], 1.0)})


def test_a_final_return_over_the_last_evaluations_is_not_decided_by_one_noisy_evaluation():
    # the committed cartpole-balance seed 0 int8 run: above its initial 670 from the 9th evaluation on, then
    # one evaluation (of 2 episodes) at 496
    curve = [670, 181, 436, 460, 495, 359, 465, 686, 737, 943, 924, 948, 966, 977, 989, 496]
    runs = {("balance", 0, "fp32"): run([670, 800, 1000], 10.0), ("balance", 0, "int8"): run(curve, 5.0)}
    last = convergence.convergence_runs(runs).set_index("precision")
    assert last.loc["int8", "final_return"] == 496 and not last.loc["int8", "beats_initial"]
    three = convergence.convergence_runs(runs, final_evals=3).set_index("precision")
    assert three.loc["int8", "final_return"] == pytest.approx((977 + 989 + 496) / 3)
    assert three.loc["int8", "beats_initial"] and three.loc["int8", "last_return"] == 496
    assert three.loc["fp32", "final_return"] == pytest.approx((670 + 800 + 1000) / 3)  # all it has
    assert three.loc["int8", "threshold"] == pytest.approx(0.9 * (670 + 800 + 1000) / 3)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="final_evals"):
            convergence.convergence_runs(runs, final_evals=bad)
