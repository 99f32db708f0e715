"""run_seeds: what a notebook built (the agent, one callback per method) trained over tasks and seeds."""

from __future__ import annotations

import pytest

from rlq.experiments.seed_runs import Agent, run_seeds, seed_jobs
from rlq.sb3 import CompressionCallback, GradualPruningCallback, GSTCallback

pytestmark = pytest.mark.usefixtures("one_thread")


def callbacks() -> dict:
    return {
        "dense": CompressionCallback(log_every=50),
        "pruning": GradualPruningCallback(final_sparsity=0.5, update_every=20, log_every=50),
        "gst": GSTCallback(bc_end=0.5, s_shift=0.25, prune_every=40, log_every=50),
    }


def test_each_run_gets_its_own_copy_of_the_callback_and_its_own_folder(tmp_path):
    built = callbacks()
    agent = Agent("TD3", hyperparams={"learning_starts": 50})
    jobs = seed_jobs(agent, built, env_ids=["Pendulum-v1"], seeds=[0, 1], method_seeds={"pruning": [0]},
                     total_timesteps=300, out=tmp_path, eval_episodes=1)  # fmt: skip
    assert [(j["keys"]["method"], j["seed"]) for j in jobs] == [
        ("dense", 0), ("pruning", 0), ("gst", 0), ("dense", 1), ("gst", 1)
    ]  # fmt: skip
    gst_jobs = [j for j in jobs if j["method"] == "gst"]
    assert gst_jobs[0]["callback"] is not gst_jobs[1]["callback"] is not built["gst"]
    assert gst_jobs[0]["callback"]._config_kwargs == built["gst"]._config_kwargs
    assert gst_jobs[1]["run_dir"] == tmp_path / "runs" / "Pendulum-v1__gst__1"
    assert (
        jobs[0]["hyperparams"] == {"learning_starts": 50} and jobs[0]["hyperparams"] is not agent.hyperparams
    )


def test_a_methods_own_keys_label_its_rows_and_its_folder_name_is_safe(tmp_path):
    sweep = {
        "dense": CompressionCallback(log_every=50),
        "exact, S_shift 0.25": GSTCallback(s_shift=0.25, transition_method="exact", log_every=50),
    }
    keys = {"exact, S_shift 0.25": {"method": "gst", "config": "exact, S_shift 0.25", "s_shift": 0.25}}
    jobs = seed_jobs(Agent("PPO"), sweep, env_ids=["CartPole-v1"], seeds=[3], keys=keys, total_timesteps=64,
                     out=tmp_path)  # fmt: skip
    assert jobs[0]["keys"] == {"env_id": "CartPole-v1", "seed": 3, "method": "dense"}
    assert jobs[1]["keys"] == {
        "env_id": "CartPole-v1", "seed": 3, "method": "gst", "config": "exact, S_shift 0.25", "s_shift": 0.25
    }  # fmt: skip
    assert jobs[1]["run_dir"] == tmp_path / "runs" / "CartPole-v1__exact_S_shift_0.25__3"


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(callbacks={"dense": object()}), "must be an rlq compression callback"),
        (dict(method_seeds={"gst": [7]}), "method_seeds"),
        (dict(method_seeds={"ppo": [0]}), "method_seeds"),
        (dict(seeds=[0, 0]), "must not repeat"),
    ],
)
def test_bad_input_is_named(change, message, tmp_path):
    args = dict(callbacks=callbacks(), env_ids=["Pendulum-v1"], seeds=[0], total_timesteps=100, out=tmp_path)
    args |= change
    with pytest.raises((TypeError, ValueError), match=message):
        seed_jobs(Agent("TD3"), **args)


def test_trains_the_cells_callbacks_and_resumes_from_the_finished_runs(tmp_path):
    agent = Agent("TD3", hyperparams={"learning_starts": 50, "batch_size": 16, "buffer_size": 300,
                                      "policy_kwargs": {"net_arch": [16, 16]}})  # fmt: skip
    args = dict(env_ids=["Pendulum-v1"], seeds=[0], total_timesteps=300, out=tmp_path, eval_episodes=1)
    results, tables = run_seeds(agent, callbacks(), **args)
    summary = tables["summary"].set_index("method")
    assert list(summary.index) == ["dense", "pruning", "gst"]
    assert summary.loc["dense", "avg_compression_ratio"] == 0.0
    assert 0 < summary.loc["pruning", "avg_compression_ratio"] < summary.loc["gst", "avg_compression_ratio"]
    assert (tmp_path / "summary.csv").exists() and (
        tmp_path / "runs" / "Pendulum-v1__gst__0" / "sb3"
    ).is_dir()
    again, tables_again = run_seeds(agent, callbacks(), **args)  # every run loads from its saved result
    assert (
        tables_again["summary"]
        .drop(columns="wall_time_s")
        .equals(tables["summary"].drop(columns="wall_time_s"))
    )


def test_a_changed_gst_knob_is_refused_naming_it_and_a_changed_evaluation_is_evaluated_again(tmp_path):
    """The notebook's cells run twice in one kernel, one run folder: what was changed is never loaded as it was."""
    from rlq.experiments.gst.training_runs import SETTINGS_FILE
    from rlq.rl.parallel import JobsFailed

    agent = Agent("TD3", hyperparams={"learning_starts": 50, "batch_size": 16, "buffer_size": 300,
                                      "policy_kwargs": {"net_arch": [16, 16]}})  # fmt: skip
    args = dict(env_ids=["Pendulum-v1"], seeds=[0], total_timesteps=200, out=tmp_path)

    def built(s_shift: float) -> dict:
        return {
            "dense": CompressionCallback(log_every=50),
            "gst": GSTCallback(bc_end=0.5, s_shift=s_shift, prune_every=40, log_every=50),
        }

    results, tables = run_seeds(agent, built(0.25), eval_episodes=1, **args)
    gst_folder = tmp_path / "runs" / "Pendulum-v1__gst__0"
    assert (gst_folder / SETTINGS_FILE).is_file()
    assert results[1]["settings"]["training"]["callback"]["gst"]["s_shift"] == 0.25
    checkpoints = sorted(p.name for p in (gst_folder / "checkpoints").iterdir())
    with pytest.raises(JobsFailed, match=r"callback\.gst\.s_shift: 0\.25, now 1\.0") as refused:
        run_seeds(agent, built(1.0), eval_episodes=1, **args)
    assert [f.keys["method"] for f in refused.value.failures] == ["gst"]  # dense is as it was: loaded
    assert sorted(p.name for p in (gst_folder / "checkpoints").iterdir()) == checkpoints  # untouched
    # only the evaluation changed: the finished runs are evaluated again from their checkpoints, not retrained
    again, tables_again = run_seeds(agent, built(0.25), eval_episodes=2, **args)
    assert [r["settings"]["evaluation"]["eval_episodes"] for r in again] == [2, 2]
    assert list(tables_again["summary"]["timesteps"]) == [200, 200]
    assert list(tables_again["summary"]["resumed_from"]) == [200, 200]
    assert tables_again["summary"]["eval_return"].tolist() != tables["summary"]["eval_return"].tolist()
    assert tables_again["summary"]["avg_compression_ratio"].equals(tables["summary"]["avg_compression_ratio"])


def test_settings_name_functions_and_objects_alike_in_every_process():
    import torch

    from rlq.core.jsonio import plain_json

    class Noise:
        pass

    settings = {"activation_fn": torch.nn.ReLU, "schedule": plain_json, "noise": Noise(), "arch": (64, 64)}
    shown = plain_json(settings)
    assert shown["activation_fn"] == "torch.nn.modules.activation.ReLU" and shown["arch"] == [64, 64]
    assert shown["schedule"] == "rlq.core.jsonio.plain_json" and "0x" not in shown["noise"]
    assert plain_json({**settings, "noise": Noise()}) == shown  # another object of the same kind: equal
