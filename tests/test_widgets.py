"""The sparsity tuner driven from Python: controls change settings, figures follow, the policy stays intact."""

from __future__ import annotations

import json

import pytest
import torch

from rlq.experiments.constraints import ConstraintError, check_value, parse_constraint
from rlq.experiments.tuner_space import SETTING_RANGES
from rlq.faces.tuner_figures import PLOTLY_MIME
from rlq.faces.widgets import SparsityTuner, TunerSettings, compress_policy
from rlq.rl.agents import train_agent

NET = [16, 16]


@pytest.fixture(scope="module")
def agent():
    hyper = {"n_steps": 64, "batch_size": 64, "policy_kwargs": {"net_arch": NET}}
    return train_agent("PPO", "CartPole-v1", 1024, seed=0, n_envs=2, hyperparams=hyper).model


def _dense_count() -> int:
    # PPO on CartPole, net_arch [16, 16]: actor 4-16-16-2, critic 4-16-16-1
    return 2 * (4 * 16 + 16 * 16) + 16 * 2 + 16 * 1


def test_compress_policy_counts_by_hand_and_leaves_the_original(agent):
    before = {k: v.clone() for k, v in agent.policy.state_dict().items()}
    out = compress_policy(agent.policy, TunerSettings(method="gst", block_size=4, sparsity=0.5))
    # only the two hidden 16x16 layers are compressed: 256 / 4 vectors entries, half of them kept
    stored = _dense_count() - 2 * 256 + 2 * (256 // 4 // 2)
    assert out["compression_ratio"] == pytest.approx(1 - stored / _dense_count())
    assert sum(r["stored"] for r in out["layers"]) == stored
    after = agent.policy.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    bc = compress_policy(agent.policy, TunerSettings(method="block_circulant", block_size=2))
    assert bc["compression_ratio"] == pytest.approx(2 * 128 / _dense_count())
    # fp32 block-circulant stores no index: 32 bits for each stored value
    assert bc["bits_per_weight"] == pytest.approx(32 * (_dense_count() - 2 * 128) / _dense_count())
    everything = compress_policy(
        agent.policy, TunerSettings(method="pruning", sparsity=0.5, skip_first_last=False)
    )
    kept = sum(round(n * 0.5) for n in (64, 256, 32, 64, 256, 16))
    assert everything["compression_ratio"] == pytest.approx(1 - kept / _dense_count())


def test_quantized_copy_has_few_weight_values_and_counts_its_bits(agent):
    out = compress_policy(agent.policy, TunerSettings(method="none", bits=2))
    weight = out["policy"].mlp_extractor.policy_net[2].weight
    assert torch.unique(weight).numel() <= 4
    # 2-bit codes plus one 32-bit scale per layer (six layers)
    assert out["stored_bytes"] == (_dense_count() * 2 + 6 * 32) / 8
    assert out["dense_bytes"] == _dense_count() * 4
    assert 2 < out["bits_per_weight"] < 2.5
    assert compress_policy(agent.policy, TunerSettings(method="none"))["bits_per_weight"] == 32


def test_evaluating_adds_a_point_and_redraws_every_figure(agent):
    tuner = SparsityTuner(
        agent, "CartPole-v1", n_episodes=2, seed=0, settings=TunerSettings(method="pruning")
    )
    first = tuner.evaluate()
    second = tuner.evaluate(TunerSettings(method="none", bits=4))
    reward = tuner.figures["reward"]
    assert list(reward.data[0].x) == [first["bits_per_weight"], second["bits_per_weight"]]
    assert second["bits_per_weight"] < 5 < first["bits_per_weight"]
    # the star is the point the status line names
    assert (
        list(reward.data[1].y) == [second["mean_return"]]
        and f"return {second['mean_return']:.1f}" in tuner.status.value
    )
    assert reward.layout.xaxis.type == "log" and "32 dense" in reward.layout.xaxis.ticktext
    assert tuner.figures["size"].layout.yaxis.type == "log"
    assert "mlp_extractor.policy_net.2" in tuner.figures["layers"].data[0].x
    # what JupyterLab shows and restores on a reload: the same figure as the Output's plain-JSON output
    (shown,) = tuner.views["reward"].output.outputs
    assert shown["data"][PLOTLY_MIME]["data"][0]["y"] == [first["mean_return"], second["mean_return"]]
    json.dumps(shown)
    assert tuner.controls["method"].value == "pruning"  # code does not move the controls
    assert len(tuner.explored()) == 2 and "settings" not in tuner.explored()


def test_a_setting_the_method_ignores_adds_no_point(agent):
    tuner = SparsityTuner(agent, "CartPole-v1", n_episodes=1, seed=0, settings=TunerSettings(method="none"))
    tuner.start()
    tuner.wait()
    for name, value in (("sparsity", 0.9), ("s_shift", 0.25), ("block_size", 8), ("skip_first_last", False)):
        tuner.controls[name].value = value  # none ignores all four
        tuner.wait()
    assert len(tuner.points) == 1 and "explored before" in tuner.status.value
    tuner.controls["method"].value = "pruning"  # now the sparsity counts; the block size still does not
    tuner.wait()
    tuner.controls["block_size"].value = 2
    tuner.wait()
    assert len(tuner.points) == 2 and tuner.current == 1
    tuner.evaluate(TunerSettings(method="pruning", sparsity=0.0))  # prunes nothing: the dense point
    assert len(tuner.points) == 2 and tuner.current == 0
    assert tuner.figures["reward"].data[1].y == (tuner.points[0]["mean_return"],)
    # nothing runs: the busy bar is empty and cancel is off
    assert (
        tuner.progress.value == 0 and tuner.cancel_button.disabled and tuner.cancel_button.button_style == ""
    )


def test_a_long_evaluation_runs_in_the_background_and_can_be_cancelled(agent):
    tuner = SparsityTuner(agent, "CartPole-v1", n_episodes=200, seed=0)
    tuner.controls["sparsity"].value = 0.3  # returns at once: the evaluation runs in a worker thread
    assert tuner._worker.is_alive() and not tuner.cancel_button.disabled
    tuner.cancel()
    assert not tuner._worker.is_alive() and tuner.points == [] and tuner.status.value == "cancelled"
    assert tuner.progress.value == 0 and tuner.cancel_button.disabled


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"method": "prune"}, "method must be one of"),
        ({"sparsity": 1.0}, "sparsity"),
        ({"bits": 1}, "bits"),
        ({"bits": 5}, "bits"),
        ({"block_size": 1}, "block_size"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TunerSettings(**kwargs)


def test_controls_and_notebook_constraints_take_the_one_declaration(agent):
    tuner = SparsityTuner(agent, "CartPole-v1", n_episodes=1, auto=False)
    assert tuner.controls["bits"].options == SETTING_RANGES["bits"].choices
    assert tuner.controls["block_size"].options == SETTING_RANGES["block_size"].choices
    assert tuner.controls["sparsity"].max == SETTING_RANGES["sparsity"].max
    block = parse_constraint("initial block size [kind: tuner.block_size]", "here")
    check_value("block_size", 8, 4, block)
    with pytest.raises(ConstraintError, match="block_size.*one of 2, 4, 8"):
        check_value("block_size", 1, 4, block)  # what `rlq run -p block_size 1` is refused with
    sweep = parse_constraint("sparsities swept [kind: tuner.sparsity]", "here")
    with pytest.raises(ConstraintError, match=r"sweep\[1\]"):
        check_value("sweep", [0.5, 0.99], [0.5], sweep)
    with pytest.raises(ConstraintError, match="cannot read"):
        parse_constraint("[kind: tuner.nothing]", "here")


def test_train_with_these_settings_writes_a_normal_run_folder_and_draws_its_curve(agent, tmp_path):
    import pandas as pd

    reference = pd.DataFrame({"timestep": [100, 200], "episode_return": [10.0, 20.0]})
    tuner = SparsityTuner(
        agent,
        "CartPole-v1",
        n_episodes=1,
        seed=0,
        train_steps=512,
        runs_dir=tmp_path,
        reference_curve=reference,
    )
    tuner.controls["sparsity"].value = 0.6  # auto-evaluation runs too; training is independent of it
    tuner.start_training()
    folder = tuner.wait_training()
    tuner.wait()
    assert folder.parent == tmp_path / "sparsity_tuner_train"
    results = json.loads((folder / "results.json").read_text())
    params = json.loads((folder / "params.json").read_text())
    assert results["status"] == "ok" and params["method"] == "gst" and params["sparsity"] == 0.6
    # block-circulant from step 0
    assert params["block_size"] == 4 and results["start_compression_ratio"] > 0.5
    assert (folder / "history.csv").exists() and list((folder / "checkpoints").glob("model_*_steps.zip"))
    training = tuner.figures["training"]
    names = [trace.name for trace in training.data]
    assert names[0].startswith("dense reference") and list(training.data[0].y) == [10.0, 20.0]
    assert len(training.data[1].y) > 0 and max(training.data[2].y) > 0.5
    assert tuner.train_progress.value == tuner.train_progress.max


def test_a_gst_training_run_is_capped_at_the_compression_the_tuner_evaluated(agent):
    from rlq.compress import GSTConfig, RewardAwareConfig
    from rlq.faces.tuner_training import training_method

    settings = TunerSettings(method="gst", block_size=4, sparsity=0.6)
    method, gst, _ = training_method(settings)
    cap = gst["sparsity"]["max_sparsity"]
    # the tuner keeps 40% of each B-vector (26 of a 16x16 layer's 64 entries, rounded): about 10% of the
    # hidden layers' weights, what the training run caps at
    layers = [r for r in compress_policy(agent.policy, settings)["layers"] if r["kind"] != "dense"]
    evaluated = 1 - sum(r["stored"] for r in layers) / sum(r["dense"] for r in layers)
    assert method == "gst" and cap == pytest.approx(evaluated, abs=1 / 256)
    assert cap == pytest.approx(0.9)
    GSTConfig(
        total_steps=10, **{**gst, "sparsity": RewardAwareConfig(**gst["sparsity"])}
    )  # within the cap rule
