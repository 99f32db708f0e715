"""QuaRL's runs (rlq.rl.run_spec), quantizers, solved thresholds, and rlq.analysis.quarl's tables and headline
numbers, on small hand-made tables (no training)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import pytest

from rlq.analysis.quarl import (
    actor_breakdown,
    actorq_numbers,
    actorq_summary,
    learner_breakdown,
    noise_control_table,
    precision_intervals,
    ptq_estimates,
    ptq_numbers,
    ptq_summary,
    qat_summary,
    quantization_figures,
)
from rlq.analysis.quarl.actorq import actor_breakdown_shares, speedup, task_name
from rlq.analysis.quarl.quantization_tables import seed_task_matrix
from rlq.experiments.constraints import Constraint, ConstraintError, check_value
from rlq.rl.evaluate import STATED_THRESHOLDS, mark_solved, solved_threshold
from rlq.rl.run_spec import RunSpec, parse_runs
from rlq.rl.zoo import zoo_hyperparams
from rlq.sb3.quantized import Quantizer


def test_run_specs_read_a_notebook_s_runs():
    specs = parse_runs([["PPO", "CartPole-v1", 100], ["DQN", "ALE/Breakout-v5", 50, {"learning_starts": 10}]])
    assert specs[0] == RunSpec("PPO", "CartPole-v1", 100, {})
    assert specs[1].hyperparams == {"learning_starts": 10}
    assert specs[1].name == "DQN ALE/Breakout-v5" and specs[1].folder == "DQN_ALE_Breakout-v5"
    assert specs[0].n_envs(8) == 8 and specs[1].n_envs(8) == 1
    with pytest.raises(ValueError, match="algorithm, environment, steps"):
        RunSpec.parse(["PPO", "CartPole-v1"])


def test_a_zoo_run_takes_the_zoo_s_budget_envs_and_settings_with_overrides_on_top():
    zoo = zoo_hyperparams("PPO", "CartPole-v1")
    spec = RunSpec.parse(["PPO", "CartPole-v1", "zoo"])
    assert spec.zoo and spec.steps == zoo.n_timesteps and spec.n_envs(4) == zoo.n_envs == 8
    assert spec.hyperparams == zoo.hyperparams and spec.policy == "MlpPolicy"
    overridden = RunSpec.parse(["PPO", "CartPole-v1", "zoo", {"n_epochs": 5}])
    assert (
        overridden.hyperparams["n_epochs"] == 5
        and overridden.hyperparams["n_steps"] == zoo.hyperparams["n_steps"]
    )
    budget = RunSpec.parse(["DQN", "CartPole-v1", 1000, "zoo"])
    assert budget.steps == 1000 and budget.hyperparams["train_freq"] == 256 and budget.n_envs(8) == 1
    with pytest.raises(ValueError, match="no DQN settings"):
        RunSpec.parse(["DQN", "NoSuchEnv-v0", "zoo"])
    with pytest.raises(ValueError, match="overrides"):
        RunSpec.parse(["DQN", "CartPole-v1", "zoo", "zoo"])


def test_the_runs_constraint_accepts_zoo_entries_and_rejects_what_the_zoo_cannot_honour():
    runs = [["DQN", "CartPole-v1", "zoo"], ["PPO", "CartPole-v1", 20_000, "zoo"], ["A2C", "CartPole-v1", 100]]
    check_value("runs", runs, None, Constraint(kind="run"))
    for bad, match in [
        (["PPO", "Acrobot-v1", "zoo"], "normalize"),
        (["PPO", "CartPole-v1", "zoo", "zoo"], "must be a dict"),
        (["PPO", "CartPole-v1", "soon"], "positive int or"),
    ]:
        with pytest.raises(ConstraintError, match=match):
            check_value("runs", [bad], None, Constraint(kind="run"))


def test_solved_thresholds_come_from_gymnasium_or_are_stated():
    assert solved_threshold("CartPole-v1") == (475.0, "Gymnasium's reward_threshold")
    assert solved_threshold("Acrobot-v1")[0] == -100.0
    assert solved_threshold("Pendulum-v1") == (
        STATED_THRESHOLDS["Pendulum-v1"],
        "stated by rlq (Gymnasium gives none)",
    )


def test_a_quantizer_names_a_bad_scheme_or_precision_and_quantizes_what_it_says():
    import torch
    from stable_baselines3 import PPO

    with pytest.raises(ValueError, match="scheme must be one of"):
        Quantizer("int4", "weights_only")
    with pytest.raises(ValueError, match="int99"):
        Quantizer("int99", "weights-only")
    assert (Quantizer("sim8", "weights-only").bits, Quantizer("int8", "onnx").backend) == (8, "onnx")
    model = PPO("MlpPolicy", "CartPole-v1", seed=0, n_steps=64, batch_size=64)

    def weights(policy) -> list[torch.Tensor]:
        return [m.weight.detach().float() for m in policy.network.modules() if isinstance(m, torch.nn.Linear)]

    fp32 = weights(Quantizer("fp32")(model))
    int3 = weights(Quantizer("int3", "weights-only")(model))
    # symmetric 3-bit weights per tensor: the levels -3..3 times max|w| / 3, the nearest one to each weight
    for w, q in zip(fp32, int3, strict=True):
        step = w.abs().max() / 3
        assert len(torch.unique(q)) <= 7
        assert torch.allclose(q, torch.round(w / step).clamp(-3, 3) * step, atol=1e-6)
    draws = [weights(Quantizer("int4", "noise", draw=d)(model, seed=0)) for d in (0, 0, 1)]
    assert all(torch.equal(a, b) for a, b in zip(draws[0], draws[1], strict=True))  # a draw is reproducible
    assert not all(torch.equal(a, b) for a, b in zip(draws[0], draws[2], strict=True))  # and draws differ
    assert all(len(torch.unique(w)) > 16 for w in draws[0])  # noise keeps the weights continuous


def agent_rows(run="PPO CartPole-v1", seed=0, fp32=500.0, solved=True, int8=490.0, sim8=500.0, int4=300.0):
    """One agent's rows of the quarl_ptq notebook's evaluation table: relative changes against ``fp32``, a noise control at 8 and 4 bits."""
    rows = [
        ("fp32", "float", 32, "torch", 0, fp32),
        ("fp16", "float", 16, "torch", 0, fp32),
        ("int8", "kernel", 8, "torch", 0, int8),
        ("int16", "weights-only", 16, "torch", 0, fp32),
        ("sim8", "weights-only", 8, "torch", 0, sim8),
        ("int4", "weights-only", 4, "torch", 0, int4),
        ("int8", "onnx", 8, "onnx", 0, int8 - 1),
        ("sim8", "noise", 8, "torch", 0, fp32),
        ("sim8", "noise", 8, "torch", 1, fp32 / 2),
        ("int4", "noise", 4, "torch", 0, fp32 / 4),
        ("int4", "noise", 4, "torch", 1, fp32 / 4),
    ]
    table = pd.DataFrame(rows, columns=["precision", "scheme", "bits", "backend", "draw", "mean_return"])
    algorithm, environment = run.split()
    return table.assign(
        algorithm=algorithm,
        environment=environment,
        run=run,
        seed=seed,
        solved=solved,
        random_return=20.0,
        relative_change=(table["mean_return"] - fp32) / fp32,
        normalised_score=(table["mean_return"] - 20.0) / (fp32 - 20.0),
    )


def ptq_rows():
    return pd.concat(
        [
            agent_rows(seed=0),
            agent_rows(seed=1, int8=500.0),
            agent_rows(seed=2, fp32=100.0, solved=False, int8=150.0, sim8=100.0, int4=100.0),
        ],
        ignore_index=True,
    )


def test_ptq_summary_reads_one_row_per_run_and_seed_and_ranks_weights_only_widths_alone():
    summary = ptq_summary(ptq_rows(), tolerance=0.05)
    assert summary["seed"].tolist() == [0, 1, 2] and summary["solved"].tolist() == [True, True, False]
    row = summary.iloc[0]
    assert (row.fp32, row.int8, row.int8_weights_only, row.onnx_int8, row.random) == (
        500.0,
        490.0,
        500.0,
        489.0,
        20.0,
    )
    assert row.int8_change_pct == pytest.approx(-2.0) and row.int8_weights_only_change_pct == 0.0
    assert row.lowest_bits_within_tolerance == 8 and row.noise8_broken == "1/2"
    # the kernel int8 breaking an agent does not move the weights-only ranking
    broken_kernel = ptq_summary(agent_rows(int8=100.0), 0.05).iloc[0]
    assert broken_kernel.lowest_bits_within_tolerance == 8
    assert ptq_summary(agent_rows(sim8=100.0), 0.05).iloc[0].lowest_bits_within_tolerance == 16
    assert "onnx_int8" not in ptq_summary(ptq_rows().query("backend == 'torch'"), 0.05).columns


def test_ptq_numbers_and_estimates_judge_solved_agents_only():
    summary = ptq_summary(ptq_rows(), tolerance=0.05)
    numbers = ptq_numbers(summary, 0.05)
    assert numbers["int8_relative_change"]["PPO CartPole-v1"] == {
        "0": pytest.approx(-0.02),
        "1": 0.0,
        "2": pytest.approx(0.5),
    }
    assert numbers["worst_int8_relative_change"] == pytest.approx(
        -0.02
    )  # the unsolved seed's +50% is not judged
    assert numbers["lowest_bits_within_tolerance"] == {"PPO CartPole-v1": 8}
    assert numbers["solved"]["PPO CartPole-v1"] == {"0": True, "1": True, "2": False}
    assert (numbers["n_solved"], numbers["n_agents"], numbers["n_runs"]) == (2, 3, 1)
    estimates = ptq_estimates(summary, reps=200)
    change = estimates["int8_reward_change_pct"]
    assert (
        change["n"] == 2 and change["unit"] == "%" and change["lower"] <= change["value"] <= change["upper"]
    )
    assert change["value"] == pytest.approx(-1.0)  # IQM of -2 and 0
    drop = estimates["int8_reward_drop_pct"]
    assert (drop["value"], drop["lower"], drop["upper"]) == (
        -change["value"],
        -change["upper"],
        -change["lower"],
    )
    assert estimates["lowest_bits_within_tolerance"]["value"] == 8.0
    assert ptq_estimates(summary.assign(solved=False)) == {}


def test_seed_task_matrix_is_a_rectangle_when_it_can_be_and_pooled_when_not():
    rows = pd.DataFrame({"run": ["a", "a", "b", "b"], "x": [1.0, 2.0, 3.0, 4.0]})
    assert seed_task_matrix(rows, "x").tolist() == [[1.0, 3.0], [2.0, 4.0]]
    assert seed_task_matrix(rows.iloc[:3], "x").tolist() == [1.0, 2.0, 3.0]


def test_noise_control_and_precision_intervals():
    ptq = ptq_rows()
    noise = noise_control_table(ptq, 0.05)
    first = noise[(noise.seed == 0) & (noise.bits == 8)].iloc[0]
    assert (first.quantized, first.noise_broken, first.noise_draws, first.quantized_broken) == (
        500.0,
        1,
        2,
        False,
    )
    four = noise[(noise.seed == 0) & (noise.bits == 4)].iloc[0]
    assert four.quantized_broken and four.noise_broken == 2
    intervals = precision_intervals(ptq, reps=200)
    assert intervals["method"].tolist()[:3] == [
        "fp16",
        "int8 kernels (weights + activations)",
        "16 bits weights-only",
    ]
    assert "noise of a 8-bit step" in intervals["method"].tolist() and set(intervals["n"]) == {2}
    assert (
        len(quantization_figures.bit_sweep_figure(ptq, 0.05).data) == 3 * 1 + 2
    )  # a line per seed, noise dots, kernel point
    assert len(quantization_figures.ptq_bars_figure(ptq_summary(ptq, 0.05)).data) == 5


def test_qat_summary_averages_seeds_per_method_and_width():
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
    assert len(quantization_figures.qat_vs_ptq_figure(summary).data) == 2
    one_seed = qat_summary(pd.DataFrame(rows[:3]))
    assert one_seed["std"].tolist() == [0.0, 0.0, 0.0]  # one seed: no spread, not NaN


def test_mark_solved_judges_each_agent_by_its_fp32_row_against_its_environment_s_threshold():
    table = pd.DataFrame(
        [
            dict(algorithm="PPO", environment="CartPole-v1", seed=0, method="fp32", mean_return=480.0),
            dict(algorithm="PPO", environment="CartPole-v1", seed=0, method="ptq", mean_return=20.0),
            dict(algorithm="PPO", environment="CartPole-v1", seed=1, method="fp32", mean_return=470.0),
            dict(algorithm="PPO", environment="CartPole-v1", seed=1, method="ptq", mean_return=490.0),
            dict(algorithm="TD3", environment="Pendulum-v1", seed=0, method="fp32", mean_return=-150.0),
            dict(
                algorithm="TD3",
                environment="MountainCarContinuous-v0",
                seed=0,
                method="fp32",
                mean_return=95.0,
            ),
        ]
    )
    marked = mark_solved(table, table.method == "fp32")
    assert marked["run"].tolist()[:3] == ["PPO CartPole-v1"] * 3
    # CartPole-v1 475 and MountainCarContinuous-v0 90 (Gymnasium's), Pendulum-v1 -200 (ours); a quantized row
    # never judges its agent
    assert marked["solved"].tolist() == [True, True, False, False, True, True]
    assert "run" not in table  # the table given is not changed


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

    def time_to_learned_return(self, threshold: float) -> float | None:
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
