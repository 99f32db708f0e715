"""The sparsity tuner driven from Python: controls change settings, figures follow, the policy stays intact."""

from __future__ import annotations

import pytest
import torch

from rlq.faces.widgets import SparsityTuner, TunerSettings, compress_policy, stored_weight_bytes
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
    _, report, ratio = compress_policy(agent.policy, TunerSettings(method="gst", block_size=4, sparsity=0.5))
    # only the two hidden 16x16 layers are compressed: 256 / 4 vectors entries, half of them kept
    stored = _dense_count() - 2 * 256 + 2 * (256 // 4 // 2)
    assert ratio == pytest.approx(1 - stored / _dense_count())
    assert sum(r["stored"] for r in report) == stored
    after = agent.policy.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    _, _, ratio_bc = compress_policy(agent.policy, TunerSettings(method="block_circulant", block_size=2))
    assert ratio_bc == pytest.approx(2 * 128 / _dense_count())
    _, _, ratio_all = compress_policy(
        agent.policy, TunerSettings(method="pruning", sparsity=0.5, skip_first_last=False)
    )
    kept = sum(round(n * 0.5) for n in (64, 256, 32, 64, 256, 16))
    assert ratio_all == pytest.approx(1 - kept / _dense_count())


def test_quantized_copy_has_few_weight_values(agent):
    policy, report, _ = compress_policy(agent.policy, TunerSettings(method="none", bits=2))
    weight = policy.mlp_extractor.policy_net[2].weight
    assert torch.unique(weight).numel() <= 4
    assert stored_weight_bytes(report, 2)["stored_bytes"] == _dense_count() * 2 / 8


def test_moving_a_control_adds_a_point_and_updates_the_figures(agent):
    tuner = SparsityTuner(agent, "CartPole-v1", n_episodes=2, seed=0)
    tuner.start()
    first = tuner.wait()
    assert len(tuner.figures["reward"].data[0].x) == 1
    tuner.controls["sparsity"].value = 0.9
    second = tuner.wait()
    assert second["sparsity"] == 0.9 and second["compression_ratio"] > first["compression_ratio"]
    reward = tuner.figures["reward"]
    assert list(reward.data[0].x) == [first["compression_ratio"], second["compression_ratio"]]
    assert list(reward.data[1].y) == [second["mean_return"]]
    layers = tuner.figures["layers"].data[0]
    assert "mlp_extractor.policy_net.2" in layers.x
    assert tuner.progress.value == tuner.progress.max == 2
    assert len(tuner.explored()) == 2 and "return" in tuner.status.value


def test_a_long_evaluation_runs_in_the_background_and_can_be_cancelled(agent):
    tuner = SparsityTuner(agent, "CartPole-v1", n_episodes=200, seed=0)
    tuner.controls["sparsity"].value = 0.3  # returns at once: the evaluation runs in a worker thread
    assert tuner._worker.is_alive()
    tuner.cancel()
    assert not tuner._worker.is_alive() and tuner.points == [] and tuner.status.value == "cancelled"
    assert tuner.progress.value < 200


@pytest.mark.parametrize(
    "kwargs, message",
    [({"method": "prune"}, "method must be one of"), ({"sparsity": 1.0}, "sparsity"), ({"bits": 1}, "bits")],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TunerSettings(**kwargs)


def test_train_with_these_settings_writes_a_normal_run_folder(agent, tmp_path):
    import json

    tuner = SparsityTuner(agent, "CartPole-v1", n_episodes=1, seed=0, train_steps=512, runs_dir=tmp_path)
    tuner.controls["sparsity"].value = 0.6  # auto-evaluation runs too; training is independent of it
    tuner.start_training()
    folder = tuner.wait_training()
    tuner.wait()
    assert folder.parent == tmp_path / "sparsity_tuner_train"
    results = json.loads((folder / "results.json").read_text())
    params = json.loads((folder / "params.json").read_text())
    assert results["status"] == "ok" and params["method"] == "gst" and params["sparsity"] == 0.6
    assert (
        params["block_size"] == 4 and results["start_compression_ratio"] > 0.5
    )  # block-circulant from step 0
    assert (folder / "history.csv").exists() and list((folder / "checkpoints").glob("model_*_steps.zip"))
    training = tuner.figures["training"]
    assert len(training.data[1].x) > 0 and max(training.data[1].y) > 0.5
    assert tuner.train_progress.value == tuner.train_progress.max
