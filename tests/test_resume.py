"""Checkpoints as one callback in a training's own loop: the same run as train_agent's, resumed where it stopped."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlq.rl.agents import make_model, train_agent
from rlq.rl.resume import Checkpoints
from rlq.sb3.checkpoint import CompressedCheckpoints, load_compressed, save_compressed
from rlq.sb3.gst_callback import GSTCallback

TINY_TD3 = {"learning_starts": 50, "buffer_size": 1000, "batch_size": 16, "policy_kwargs": {"net_arch": [8]}}


def _own_loop(folder, total, every=0, callbacks=()):
    """One training as a notebook's per-run function writes it."""
    checkpoints = Checkpoints(folder, every=every)
    model = checkpoints.resume(make_model("TD3", "Pendulum-v1", seed=3, hyperparams=TINY_TD3), callbacks)
    model.learn(total - model.num_timesteps, callback=[*callbacks, checkpoints], reset_num_timesteps=False)
    return model, checkpoints


def _actor_weights(model):
    return torch.cat([p.detach().flatten() for p in model.actor.parameters()])


def test_a_fresh_run_is_the_run_train_agent_makes(tmp_path):
    model, checkpoints = _own_loop(tmp_path / "own", 300)
    reference = train_agent(
        make_model("TD3", "Pendulum-v1", seed=3, hyperparams=TINY_TD3), 300, Checkpoints(tmp_path / "ref")
    )
    assert torch.equal(_actor_weights(model), _actor_weights(reference.model))
    assert checkpoints.curve[["timestep", "episode_return"]].equals(
        reference.curve[["timestep", "episode_return"]]
    )
    assert checkpoints.resumed_from is None
    assert checkpoints.last_checkpoint == tmp_path / "own" / "checkpoints" / "model_300_steps.zip"
    assert list((tmp_path / "own" / "sb3").glob("progress_from_0.csv"))


def test_an_interrupted_run_resumes_from_its_newest_checkpoint_with_its_curve(tmp_path):
    _own_loop(tmp_path, 400, every=200)  # finished: its checkpoints at 200 and 400
    (tmp_path / "checkpoints" / "model_400_steps.zip").unlink()  # as if stopped before the end
    model, checkpoints = _own_loop(tmp_path, 400, every=200)
    assert checkpoints.resumed_from == 200
    assert model.num_timesteps == 400
    # the first attempt's buffer came back (saved from inside step 200, before SB3 stores that step's transition)
    assert model.replay_buffer.size() == 399
    assert checkpoints.curve["timestep"].is_monotonic_increasing
    assert checkpoints.curve["timestep"].iloc[-1] == 400  # Pendulum's episodes are 200 steps: 2 of them


def test_a_finished_run_trains_no_further_and_keeps_its_numbers(tmp_path):
    first_model, first = _own_loop(tmp_path, 200)
    again_model, again = _own_loop(tmp_path, 200)
    assert again.resumed_from == 200 and again_model.num_timesteps == 200
    assert again.curve.equals(first.curve)
    assert torch.equal(_actor_weights(again_model), _actor_weights(first_model))
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("model_*")) == ["model_200_steps.zip"]


def test_learn_without_resume_over_existing_checkpoints_is_refused(tmp_path):
    _own_loop(tmp_path, 100)
    checkpoints = Checkpoints(tmp_path)
    model = make_model("TD3", "Pendulum-v1", seed=3, hyperparams=TINY_TD3)
    with pytest.raises(RuntimeError, match="call checkpoints.resume"):
        model.learn(100, callback=checkpoints)


def test_a_gst_schedule_resumes_with_its_state_and_compressed_weights(tmp_path):
    def gst():
        return GSTCallback(block_schedule=[(0.0, 4)], bc_end=0.5, s_shift=0.5, prune_every=50, log_every=50)

    def run(total):
        callback = gst()
        checkpoints = CompressedCheckpoints(tmp_path, every=200)
        hyperparams = {**TINY_TD3, "policy_kwargs": {"net_arch": [8, 8]}}  # a middle layer to compress
        model = checkpoints.resume(
            make_model("TD3", "Pendulum-v1", seed=3, hyperparams=hyperparams), [callback]
        )
        model.learn(total - model.num_timesteps, callback=[callback, checkpoints], reset_num_timesteps=False)
        return model, callback, checkpoints

    _, first_gst, _ = run(200)
    model, resumed_gst, checkpoints = run(400)
    assert checkpoints.resumed_from == 200
    history = resumed_gst.history
    assert history["step"].iloc[0] == 0 and history["step"].iloc[-1] == 400  # the first attempt's rows kept
    assert np.isclose(first_gst.history["compression_ratio"].iloc[0], history["compression_ratio"].iloc[0])
    assert checkpoints.save_model is save_compressed and checkpoints.load_model is load_compressed
    assert model.num_timesteps == 400
