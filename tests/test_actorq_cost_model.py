"""ActorQ's cost model: hand-worked cases of predict_speedup, costs from a breakdown, the curve over learner speed."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from rlq.actorq import BREAKDOWN_KEYS, predict_speedup, speedup_curve, step_costs
from rlq.actorq.actor import ACTOR_TIMERS
from rlq.actorq.cost_model import StepCosts, Topology, result_costs, steady_steps_per_s


def per_step(env=0.0, inference=0.0, load=0.0) -> dict[str, float]:
    """An actor's per-step breakdown with the three components these cases use."""
    out = dict.fromkeys(ACTOR_TIMERS, 0.0)
    out.update(actor_env_step=env, actor_inference=inference, actor_load=load)
    return out


FP32 = per_step(env=0.001, inference=0.003)  # 4 ms per step
INT8 = per_step(env=0.001, inference=0.0002, load=0.0003)  # 1.5 ms per step


def test_actor_bound_fp32_against_learner_bound_int8():
    # Learner: 16 ms per update at one update per 8 transitions (32 samples per insert, batch 256) = 2 ms.
    p = predict_speedup(FP32, INT8, Topology(1, cores=2), learner_seconds_per_update=0.016,
                        samples_per_insert=32.0, batch_size=256)  # fmt: skip
    assert p.learner_seconds_per_step == pytest.approx(0.002)
    # fp32: max(learner 2, actors 4 / 1, cores (4 + 2) / 2 = 3) = 4 ms, the actors bind.
    assert p.seconds_per_step_fp32 == pytest.approx(0.004) and p.bound_fp32 == "actors"
    # int8: max(2, 1.5, (1.5 + 2) / 2 = 1.75) = 2 ms, the learner binds.
    assert p.seconds_per_step_q == pytest.approx(0.002) and p.bound_q == "learner"
    assert p.speedup == pytest.approx(2.0)


def test_learner_bound_gives_no_speedup():
    # The paper's rate limit with an 0.8 s update on this CPU: 100 ms per transition against actors' 4 and 1.5.
    p = predict_speedup(FP32, INT8, Topology(4, cores=2), 0.8, 32.0, 256)
    assert p.bound_fp32 == p.bound_q == "learner"
    assert p.seconds_per_step_fp32 == pytest.approx(0.1) and p.speedup == pytest.approx(1.0)


def test_shared_cores_bind_when_actors_outnumber_them():
    # 4 actors and the learner on 2 cores; learner 1 ms per step (8 ms update at 1 per 8 transitions).
    p = predict_speedup(FP32, INT8, Topology(4, cores=2), 0.008, 32.0, 256)
    # fp32: max(1, 4 / 4 = 1, (4 + 1) / 2 = 2.5) = 2.5 ms; int8: max(1, 0.375, (1.5 + 1) / 2 = 1.25) = 1.25 ms.
    assert p.bound_fp32 == "cores" and p.seconds_per_step_fp32 == pytest.approx(0.0025)
    assert p.bound_q == "cores" and p.seconds_per_step_q == pytest.approx(0.00125)
    assert p.speedup == pytest.approx(2.0)
    # With a core for each role the same actors are no longer bound by cores: 4 / 4 = 1 ms against 1 ms.
    free = predict_speedup(FP32, INT8, Topology(4), 0.008, 32.0, 256)
    assert free.seconds_per_step_fp32 == pytest.approx(0.001) and free.speedup == pytest.approx(1.0)


def test_serial_layout_adds_both_sides_and_driver_work():
    # The local backend: (4 + 2 + 0.5) / (1.5 + 2 + 0.5) ms.
    p = predict_speedup(
        FP32, INT8, Topology(3, layout="serial"), 0.016, 32.0, 256, driver_seconds_per_step=0.0005
    )
    assert p.bound_fp32 == p.bound_q == "serial"
    assert p.seconds_per_step_fp32 == pytest.approx(0.0065) and p.seconds_per_step_q == pytest.approx(0.004)
    assert p.speedup == pytest.approx(6.5 / 4.0)


def test_step_costs_accepted_in_place_of_mappings():
    costs = StepCosts(FP32, 0.016, 0.0)
    assert costs.actor_seconds_per_step == pytest.approx(0.004)
    p = predict_speedup(costs, StepCosts(INT8, 0.016, 0.0), Topology(1, cores=2), 0.016, 32.0, 256)
    assert p.speedup == pytest.approx(2.0) and p.as_dict()["speedup"] == pytest.approx(2.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n_actors=0), "n_actors"),
        (dict(batch_size=2.5), "batch_size"),
        (dict(learner_seconds_per_update=-1.0), "learner_seconds_per_update"),
        (dict(samples_per_insert=0), "samples_per_insert"),
        (dict(samples_per_insert=math.nan), "samples_per_insert"),
        (dict(layout="threads"), "layout"),
        (dict(cores=0), "cores"),
        (dict(breakdown_fp32={"actor_env_step": 0.001, "learner_update": 1.0}), "not actor timers"),
        (dict(breakdown_q=dict.fromkeys(ACTOR_TIMERS, 0.0)), "sum to"),
    ],
)
def test_bad_input_names_the_parameter(kwargs, message):
    kwargs = dict(kwargs)
    topology = {"n_actors": 1, **{k: kwargs.pop(k) for k in ("n_actors", "cores", "layout") if k in kwargs}}
    args = dict(breakdown_fp32=FP32, breakdown_q=INT8, learner_seconds_per_update=0.016,
                samples_per_insert=32.0, batch_size=256)  # fmt: skip
    with pytest.raises(ValueError, match=message):
        predict_speedup(topology=Topology(**topology), **{**args, **kwargs})


def test_step_costs_divides_each_component_by_its_own_count():
    totals = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    totals.update(actor_env_step=2.0, actor_inference=6.0, actor_load=1.5, learner_sample=1.0,
                  learner_update=9.0, learner_insert=0.5, broadcast=1.5, evaluate=100.0)  # fmt: skip
    costs = step_costs(totals, env_steps=2000, learner_steps=50, warmup_steps=500)
    assert costs.actor["actor_env_step"] == pytest.approx(2.0 / 2000)  # every step steps the environment
    assert costs.actor["actor_inference"] == pytest.approx(6.0 / 1500)  # only policy steps infer
    assert costs.actor["actor_load"] == pytest.approx(1.5 / 1500)
    assert costs.learner_seconds_per_update == pytest.approx(10.0 / 50)
    assert costs.driver_seconds_per_step == pytest.approx(2.0 / 2000)  # evaluation is not training time
    with pytest.raises(ValueError, match="lacks"):
        step_costs({"actor_env_step": 1.0}, 10, 1)
    with pytest.raises(ValueError, match="policy steps"):
        step_costs(totals, env_steps=500, learner_steps=50, warmup_steps=500)


def test_speedup_curve_rises_to_the_actor_ratio():
    fp32, int8 = StepCosts(FP32, 0.8, 0.0), StepCosts(INT8, 0.8, 0.0)
    curve = speedup_curve(
        fp32, int8, [1, 10, 100, 1000], Topology(4), samples_per_insert=32.0, batch_size=256
    )
    assert list(curve["learner_factor"]) == [1, 10, 100, 1000]
    assert curve["speedup"].is_monotonic_increasing
    assert curve["speedup"].iloc[0] == pytest.approx(1.0) and curve["bound_fp32"].iloc[0] == "learner"
    # At N = 1000 the learner takes 0.1 ms per transition: both precisions are bound by their 4 actors.
    assert curve["bound_q"].iloc[-1] == "actors"
    assert curve["speedup"].iloc[-1] == pytest.approx(4.0 / 1.5)


def test_steady_rate_leaves_out_warm_up():
    history = pd.DataFrame(dict(wall_time_s=[0.0, 5.0, 15.0, 25.0], env_steps=[0, 1000, 2000, 3000],
                                learner_steps=[0, 10, 20, 30]))  # fmt: skip
    assert steady_steps_per_s(history) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="two evaluations"):
        steady_steps_per_s(history.iloc[:2])


def test_costs_of_a_real_run_add_up_to_its_breakdown():
    from rlq.actorq import ActorQConfig, train

    config = ActorQConfig(env_id="Pendulum-v1", n_actors=1, hidden_sizes=(32, 32), batch_size=32, learner_steps=40,
                          learning_starts=200, samples_per_insert=8.0, update_period=20, eval_every=20,
                          eval_episodes=1, torch_threads=1, actor_backend="torch", actor_precision="fp32")  # fmt: skip
    result = train(config)
    costs = result_costs(result)
    policy_steps = result.env_steps - 200
    b = result.breakdown
    assert costs.actor["actor_inference"] * policy_steps == pytest.approx(b["actor_inference"])
    assert costs.actor["actor_env_step"] * result.env_steps == pytest.approx(b["actor_env_step"])
    assert costs.learner_seconds_per_update * 40 == pytest.approx(b["learner_sample"] + b["learner_update"])
    assert costs.actor_seconds_per_step > 0 and costs.driver_seconds_per_step > 0


def test_one_runs_prediction_uses_its_own_learner_and_actor_costs():
    from rlq.actorq.cost_model import predict_seconds_per_step

    costs = StepCosts({"actor_env_step": 0.002, "actor_inference": 0.003}, 0.08, 0.0005)
    learner = 0.08 * 4.0 / 32 + 0.0005  # seconds of the learner process per transition
    serial, bound = predict_seconds_per_step(costs, Topology(1, layout="serial"), 4.0, 32)
    assert (serial, bound) == (pytest.approx(0.005 + learner), "serial")
    parallel, bound = predict_seconds_per_step(costs, Topology(2, cores=3.0), 4.0, 32)
    assert parallel == pytest.approx(max(learner, 0.005 / 2, (0.005 + learner) / 3)) and bound == "learner"
    # two runs whose learners differ: the ratio of their own predictions
    cheap = StepCosts(costs.actor, 0.008, 0.0005)
    assert predict_seconds_per_step(cheap, Topology(2, cores=3.0), 4.0, 32) == (
        pytest.approx(0.0025),
        "actors",
    )
