"""rlq.experiments.quarl's runs, tables and headline numbers, on small hand-made tables (no training)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import pytest

from rlq.experiments.quarl import (
    RunSpec,
    actor_breakdown,
    actor_breakdown_shares,
    actorq_numbers,
    actorq_summary,
    figures,
    learner_breakdown,
    parse_runs,
    ptq_numbers,
    ptq_precisions,
    ptq_summary,
    qat_numbers,
    qat_summary,
    qat_vs_ptq_table,
    speedup,
    task_name,
)


def test_run_specs_read_a_notebook_s_runs():
    specs = parse_runs([["PPO", "CartPole-v1", 100], ["DQN", "ALE/Breakout-v5", 50, {"learning_starts": 10}]])
    assert specs[0] == RunSpec("PPO", "CartPole-v1", 100, {})
    assert specs[1].hyperparams == {"learning_starts": 10}
    assert specs[1].name == "DQN ALE/Breakout-v5" and specs[1].folder == "DQN_ALE_Breakout-v5"
    assert specs[0].n_envs(8) == 8 and specs[1].n_envs(8) == 1
    with pytest.raises(ValueError, match="algorithm, environment, steps"):
        RunSpec.parse(["PPO", "CartPole-v1"])


def test_ptq_precisions_put_the_real_kernels_first_and_do_not_repeat_int8():
    assert ptq_precisions([16, 8, 4]) == ["fp32", "fp16", "int8", "int16", "int4"]


def ptq_rows():
    rows = []
    for bits, precision, mean, change in [
        (32, "fp32", 100.0, 0.0),
        (16, "fp16", 100.0, 0.0),
        (8, "int8", 98.0, -0.02),
        (4, "int4", 90.0, -0.1),
        (2, "int2", 20.0, -0.8),
    ]:
        rows.append(
            dict(
                algorithm="PPO",
                environment="CartPole-v1",
                random_return=20.0,
                precision=precision,
                bits=bits,
                backend="torch",
                mean_return=mean,
                relative_change=change,
            )
        )
    rows.append(
        dict(
            algorithm="PPO",
            environment="CartPole-v1",
            random_return=20.0,
            precision="int8",
            bits=8,
            backend="onnx",
            mean_return=97.0,
            relative_change=-0.03,
        )
    )
    ptq = pd.DataFrame(rows)
    ptq["run"] = ptq["algorithm"] + " " + ptq["environment"]
    return ptq


def test_ptq_summary_and_numbers_read_one_row_per_run():
    summary = ptq_summary(ptq_rows(), tolerance=0.05)
    row = summary.iloc[0]
    assert (row.fp32, row.int8, row.onnx_int8, row.random) == (100.0, 98.0, 97.0, 20.0)
    assert row.int8_change_pct == pytest.approx(-2.0) and row.lowest_bits_within_tolerance == 8
    numbers = ptq_numbers(summary, 0.05)
    assert numbers["int8_relative_change"] == {"PPO CartPole-v1": pytest.approx(-0.02)}
    assert numbers["worst_int8_relative_change"] == pytest.approx(-0.02) and numbers["n_runs"] == 1
    without_onnx = ptq_summary(ptq_rows().query("backend == 'torch'"), tolerance=0.05)
    assert "onnx_int8" not in without_onnx.columns


def test_qat_tables_average_seeds_and_compare_qat_with_ptq():
    rows = []
    for seed, shift in ((0, 0.0), (1, 10.0)):
        rows += [
            dict(run="PPO CartPole-v1", seed=seed, method="fp32", bits=32, mean_return=400.0 + shift),
            dict(run="PPO CartPole-v1", seed=seed, method="ptq", bits=2, mean_return=100.0 + shift),
            dict(run="PPO CartPole-v1", seed=seed, method="qat", bits=2, mean_return=300.0 + shift),
        ]
    summary = qat_summary(pd.DataFrame(rows))
    assert summary.loc[summary.method == "fp32", "mean"].item() == 405.0
    assert summary.loc[summary.method == "qat", "std"].item() == pytest.approx(7.0710678)
    wide = qat_vs_ptq_table(summary)
    assert wide["qat_minus_ptq"].tolist() == [200.0] and wide["fp32"].tolist() == [405.0]
    numbers = qat_numbers(wide, summary)
    assert numbers["qat_return"] == {"PPO CartPole-v1": {"2": 305.0}}
    assert numbers["fp32_return"] == {"PPO CartPole-v1": 405.0} and numbers["mean_qat_minus_ptq"] == 200.0
    assert len(figures.qat_vs_ptq_figure(summary).data) == 2


@dataclass
class FakeActorQRun:
    """What the ActorQ tables read of an :class:`rlq.actorq.ActorQResult`."""

    reach_at: float | None
    env_steps: int = 1000
    bytes_per_broadcast: int = 100
    actor_steps_per_s: float = 50.0
    actor_backend: str = "torch-fp32"
    wall_time_s: float = 10.0
    breakdown: dict = field(
        default_factory=lambda: {
            "actor_env_step": 1.0,
            "actor_inference": 1.0,
            "actor_pull": 1.0,
            "actor_deserialize": 0.5,
            "actor_load": 0.5,
            "learner_update": 3.0,
            "learner_sample": 0.0,
            "learner_insert": 0.0,
            "broadcast": 0.0,
            "learner_wait": 0.0,
        }
    )

    @property
    def history(self) -> pd.DataFrame:
        return pd.DataFrame({"wall_time_s": [1.0, 2.0], "eval_return": [10.0, 20.0]})

    def time_to_return(self, threshold: float) -> float | None:
        return self.reach_at


def test_actorq_speedup_is_the_geometric_mean_over_tasks_where_both_reach_the_threshold():
    results = {
        ("dm_control/a-v0", "fp32"): FakeActorQRun(8.0),
        ("dm_control/a-v0", "int8"): FakeActorQRun(2.0),
        ("dm_control/b-v0", "fp32"): FakeActorQRun(9.0),
        ("dm_control/b-v0", "int8"): FakeActorQRun(1.0),
        ("dm_control/c-v0", "fp32"): FakeActorQRun(None),
        ("dm_control/c-v0", "int8"): FakeActorQRun(1.0),
    }
    assert speedup(results, "int8", 500.0) == pytest.approx(6.0)  # sqrt(4 * 9)
    assert speedup(results, "fp16", 500.0) is None
    assert task_name("dm_control/cartpole-balance-v0") == "cartpole-balance"


def test_actorq_breakdowns_and_numbers():
    results = {
        ("dm_control/a-v0", "fp32"): FakeActorQRun(None),
        ("dm_control/a-v0", "int8"): FakeActorQRun(None),
    }
    actors = actor_breakdown(results)
    assert (
        actors.loc[(actors.precision == "int8") & (actors.part == "step"), "seconds_per_1000_steps"].item()
        == 2.0
    )
    assert actor_breakdown_shares(results)["fp32"] == {
        "step": 0.5,
        "pull": 0.25,
        "deserialize": 0.125,
        "load": 0.125,
    }
    learner = learner_breakdown(results, "local")
    assert learner.loc[learner.part == "actors (in process)", "seconds"].tolist() == [4.0, 4.0]
    assert "actors (in process)" not in set(learner_breakdown(results, "ray")["part"])
    summary = actorq_summary(results, 500.0)
    numbers = actorq_numbers(results, summary, 500.0)
    assert numbers["speedup_int8_vs_fp32"] is None and numbers["speedup_fp16_vs_fp32"] is None
    assert numbers["bytes_per_broadcast"] == {"fp32": 100, "int8": 100}
    assert numbers["final_return"] == {"a/fp32": 20.0, "a/int8": 20.0}
    assert numbers["actor_engine"] == {"fp32": "torch-fp32", "int8": "torch-fp32"}
