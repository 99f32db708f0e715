"""SB3 agents: every algorithm builds and learns a step; checkpoints resume; no stray SB3 log folders."""

from __future__ import annotations

import tempfile

import pytest

from rlq.rl.agents import make_model, train_agent
from rlq.rl.algorithms import ALGORITHM_NAMES
from rlq.rl.checkpoints import KEEP_CHECKPOINTS, latest_checkpoint
from rlq.rl.episodes import finished_episodes
from rlq.rl.resume import Checkpoints

TINY = {"policy_kwargs": {"net_arch": [8]}}
ON_POLICY = {"n_steps": 32, **TINY}
OFF_POLICY = {"learning_starts": 32, "buffer_size": 1000, "batch_size": 16, **TINY}


def train(algo, env_id, steps, run_dir=None, every=0, keep=KEEP_CHECKPOINTS, **model_kwargs):
    """train_agent on a fresh make_model, checkpointed in run_dir: a training as each test below resumes it."""
    checkpoints = Checkpoints(run_dir, every, keep=keep) if run_dir is not None else None
    return train_agent(make_model(algo, env_id, **model_kwargs), steps, checkpoints)


@pytest.mark.parametrize("algo", ALGORITHM_NAMES)
def test_every_algorithm_builds_and_learns(algo, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where SB3 would leave SB3-<timestamp> folders
    env_id = "CartPole-v1" if algo in ("DQN", "A2C", "PPO") else "Pendulum-v1"
    hyper = ON_POLICY if algo in ("A2C", "PPO") else OFF_POLICY
    if algo == "PPO":
        hyper = {**hyper, "batch_size": 32}
    model = make_model(algo, env_id, seed=0, hyperparams=hyper)
    model.learn(64)
    assert model.num_timesteps >= 64
    assert not list(tmp_path.glob("SB3-*"))


def test_finished_episodes_reads_monitor_entries_and_skips_the_rest():
    infos = [
        {"episode": {"r": 12.5, "l": 13, "t": 0.1}},
        {},
        None,
        "not a dict",
        {"episode": {"r": -1, "l": 4.0}, "terminal_observation": [0.0]},
    ]
    assert finished_episodes(infos) == [(12.5, 13), (-1.0, 4)]
    assert finished_episodes(None) == [] and finished_episodes([]) == []


def test_bad_algorithm_and_hyperparameter_are_named():
    with pytest.raises(ValueError, match="unknown algorithm 'PPG'"):
        make_model("PPG", "CartPole-v1")
    with pytest.raises(ValueError, match="bad hyperparameter for PPO"):
        make_model("PPO", "CartPole-v1", hyperparams={"no_such_arg": 1})


def test_on_policy_training_resumes_from_its_checkpoint(tmp_path):
    kwargs = dict(seed=0, n_envs=2, hyperparams={**ON_POLICY, "batch_size": 32}, run_dir=tmp_path, every=128)
    first = train("PPO", "CartPole-v1", 256, **kwargs)
    assert first.resumed_from is None and first.model.num_timesteps == 256
    assert latest_checkpoint(tmp_path / "checkpoints")[0] == 256
    assert len(list((tmp_path / "checkpoints").glob("model_*_steps.zip"))) == 2  # 128 and 256
    second = train("PPO", "CartPole-v1", 512, **kwargs)
    assert second.resumed_from == 256 and second.model.num_timesteps == 512
    assert second.curve.iloc[: len(first.curve)].equals(first.curve)  # earlier episodes kept, not re-run
    assert len(second.curve) > len(first.curve)
    assert second.wall_time_s >= first.wall_time_s
    assert (tmp_path / "sb3" / "progress_from_256.csv").exists()


def test_off_policy_resume_restores_the_replay_buffer(tmp_path):
    kwargs = dict(seed=0, hyperparams=OFF_POLICY, run_dir=tmp_path, every=100)
    train("TD3", "Pendulum-v1", 200, **kwargs)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("replay_*")) == [
        "replay_100_steps.pkl", "replay_200_steps.pkl",
    ]  # fmt: skip
    second = train("TD3", "Pendulum-v1", 300, **kwargs)
    assert second.resumed_from == 200
    assert second.model.replay_buffer.size() == 300


def test_a_finished_run_resumed_trains_no_further(tmp_path):
    kwargs = dict(seed=0, hyperparams={**ON_POLICY, "batch_size": 32}, run_dir=tmp_path)
    first = train("PPO", "CartPole-v1", 64, **kwargs)
    again = train("PPO", "CartPole-v1", 64, **kwargs)
    assert again.resumed_from == first.model.num_timesteps == again.model.num_timesteps


def test_corrupt_checkpoint_is_reported_by_name(tmp_path):
    kwargs = dict(seed=0, hyperparams={**ON_POLICY, "batch_size": 32}, run_dir=tmp_path)
    train("PPO", "CartPole-v1", 64, **kwargs)
    steps, path = latest_checkpoint(tmp_path / "checkpoints")
    path.write_bytes(b"not a zip")
    with pytest.raises(RuntimeError, match=f"checkpoint {path}"):
        train("PPO", "CartPole-v1", 128, **kwargs)


def test_damaged_state_file_is_reported_by_name_with_what_to_do(tmp_path):
    kwargs = dict(seed=0, hyperparams={**ON_POLICY, "batch_size": 32}, run_dir=tmp_path)
    train("PPO", "CartPole-v1", 64, **kwargs)
    steps, _ = latest_checkpoint(tmp_path / "checkpoints")
    state = tmp_path / "checkpoints" / f"state_{steps}_steps.json"
    state.write_text(state.read_text()[:10])  # truncated, as a crash mid-write by another tool would leave it
    with pytest.raises(ValueError, match=rf"state_{steps}_steps.json is damaged.*model_{steps}_steps.zip"):
        train("PPO", "CartPole-v1", 128, **kwargs)


def test_a_second_attempt_from_the_same_step_keeps_the_first_attempts_log(tmp_path):
    kwargs = dict(seed=0, hyperparams={**ON_POLICY, "batch_size": 32}, run_dir=tmp_path)
    train("PPO", "CartPole-v1", 64, **kwargs)  # no checkpoint in between: a rerun starts from step 64
    first_log = (tmp_path / "sb3" / "progress_from_0.csv").read_text()
    train("PPO", "CartPole-v1", 64, **kwargs)
    train("PPO", "CartPole-v1", 64, **kwargs)
    logs = sorted(p.name for p in (tmp_path / "sb3").glob("progress_from_*"))
    assert logs == ["progress_from_0.csv", "progress_from_64.2.csv", "progress_from_64.csv"]
    assert (tmp_path / "sb3" / "progress_from_0.csv").read_text() == first_log


def test_a_save_killed_before_its_model_is_in_place_resumes_from_the_previous_checkpoint_whole(
    tmp_path, monkeypatch, caplog
):
    """The previous checkpoint keeps its replay buffer until the new model file is in place; a resume passes
    over the incomplete newer checkpoint (saying so) and gets the previous one with its full buffer."""
    from pathlib import Path

    kwargs = dict(seed=0, hyperparams=OFF_POLICY, run_dir=tmp_path, every=100)
    train("TD3", "Pendulum-v1", 100, **kwargs)
    real_replace = Path.replace

    def killed_at_the_model(self, target):
        if Path(target).name.startswith("model_200"):
            raise KeyboardInterrupt("killed while saving")
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", killed_at_the_model)
    with pytest.raises(KeyboardInterrupt):
        train("TD3", "Pendulum-v1", 200, **kwargs)
    monkeypatch.setattr(Path, "replace", real_replace)
    ckpt = tmp_path / "checkpoints"
    assert (ckpt / "replay_100_steps.pkl").exists() and (ckpt / "replay_200_steps.pkl").exists()
    (ckpt / ".tmp_model_200.zip").rename(
        ckpt / "model_200_steps.zip"
    )  # as if the rename came, the state did not
    (ckpt / "state_200_steps.json").unlink()
    (ckpt / "replay_200_steps.pkl").unlink()
    with caplog.at_level("WARNING", logger="rlq.rl.checkpoints"):
        assert latest_checkpoint(ckpt)[0] == 100
    assert (
        f"{ckpt}: the checkpoint at 200 steps lacks state_200_steps.json and replay_200_steps.pkl; "
        in caplog.text
    )
    assert "resuming from the checkpoint at 100 steps" in caplog.text
    resumed = train("TD3", "Pendulum-v1", 150, **kwargs)
    assert resumed.resumed_from == 100 and resumed.model.replay_buffer.size() == 150


def test_the_newest_three_checkpoints_are_kept_and_the_newest_two_replay_buffers(tmp_path):
    ckpt = tmp_path / "checkpoints"
    train("TD3", "Pendulum-v1", 300, seed=0, hyperparams=OFF_POLICY, run_dir=tmp_path, every=50)
    kept = sorted(p.name for p in ckpt.iterdir())
    assert kept == sorted(
        [
            f"{kind}_{s}_steps.{ext}"
            for s in (200, 250, 300)
            for kind, ext in (("model", "zip"), ("curve", "csv"), ("state", "json"))
        ]
        + ["replay_250_steps.pkl", "replay_300_steps.pkl"]
    )
    train(
        "PPO",
        "CartPole-v1",
        256,
        hyperparams=ON_POLICY,
        run_dir=tmp_path / "ppo",
        every=32,
        keep=1,
    )
    assert sorted(p.name for p in (tmp_path / "ppo" / "checkpoints").iterdir()) == [
        "curve_256_steps.csv", "model_256_steps.zip", "state_256_steps.json",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="keep must be"):
        train("PPO", "CartPole-v1", 64, hyperparams=ON_POLICY, run_dir=tmp_path / "x", keep=0)


def test_following_the_damaged_checkpoint_advice_resumes_an_off_policy_run_from_the_one_before(tmp_path):
    """The checkpoint before the newest keeps its replay buffer, so moving the damaged newest away, as the
    error says, loses only the steps since that one."""
    kwargs = dict(seed=0, hyperparams=OFF_POLICY, run_dir=tmp_path, every=100)
    train("TD3", "Pendulum-v1", 300, **kwargs)
    ckpt = tmp_path / "checkpoints"
    (ckpt / "model_300_steps.zip").write_bytes(b"not a zip")
    with pytest.raises(RuntimeError) as raised:
        train("TD3", "Pendulum-v1", 400, **kwargs)
    advice = str(raised.value).split(". ")[-1]
    assert advice == (
        f"Move model_300_steps.zip, curve_300_steps.csv, state_300_steps.json, replay_300_steps.pkl out of {ckpt}: "
        "training then resumes from the checkpoint at 200 steps, its replay buffer included."
    )
    moved = tmp_path / "damaged"
    moved.mkdir()
    for name in advice.removeprefix("Move ").split(" out of ")[0].split(", "):
        (ckpt / name).rename(moved / name)
    resumed = train("TD3", "Pendulum-v1", 400, **kwargs)
    # 199 transitions of the checkpoint (SB3 calls the callback before it stores a step's transition) + 200 new
    assert resumed.resumed_from == 200 and resumed.model.replay_buffer.size() == 399
