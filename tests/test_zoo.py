"""rlq.rl.zoo reads rl-zoo3's tuned settings from the installed package's YAML files, as they are written there."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch.nn as nn
import yaml

from rlq.rl.zoo import (
    LinearSchedule,
    ZooSettingError,
    parse_policy_kwargs,
    zoo_env_ids,
    zoo_hyperparams,
)


def zoo_yaml(algo: str) -> dict:
    """The zoo's YAML for ``algo``, read here independently of rlq.rl.zoo."""
    folder = Path(importlib.util.find_spec("rl_zoo3").submodule_search_locations[0]) / "hyperparams"
    return yaml.safe_load((folder / f"{algo}.yml").read_text())


def test_dqn_cartpole_is_the_zoo_s_entry_with_its_budget_and_network():
    raw = zoo_yaml("dqn")["CartPole-v1"]
    settings = zoo_hyperparams("dqn", "CartPole-v1")
    assert settings.algorithm == "DQN" and settings.n_timesteps == int(float(raw["n_timesteps"]))
    assert settings.n_envs == raw.get("n_envs", 1) and settings.policy == raw["policy"]
    for key in (
        "learning_rate",
        "batch_size",
        "buffer_size",
        "learning_starts",
        "train_freq",
        "gradient_steps",
    ):
        assert settings.hyperparams[key] == raw[key]
    assert "net_arch=[256, 256]" in raw["policy_kwargs"]
    assert settings.hyperparams["policy_kwargs"] == {"net_arch": [256, 256]}
    assert (
        settings.source == "rl_zoo3/hyperparams/dqn.yml: CartPole-v1"
    )  # no machine path in what a notebook prints


def test_ppo_cartpole_linear_schedules_decay_to_zero():
    raw = zoo_yaml("ppo")["CartPole-v1"]
    settings = zoo_hyperparams("PPO", "CartPole-v1")
    assert settings.n_envs == raw["n_envs"] and settings.n_timesteps == int(float(raw["n_timesteps"]))
    lr = settings.hyperparams["learning_rate"]
    assert raw["learning_rate"].startswith("lin_") and isinstance(lr, LinearSchedule)
    assert lr(1.0) == pytest.approx(float(raw["learning_rate"][4:])) and lr(0.0) == 0.0
    assert settings.hyperparams["clip_range"](0.5) == pytest.approx(0.5 * float(raw["clip_range"][4:]))
    assert not {"n_envs", "n_timesteps", "policy"} & set(settings.hyperparams)


def test_td3_pendulum_noise_becomes_an_action_noise_object():
    from stable_baselines3.common.noise import NormalActionNoise

    raw = zoo_yaml("td3")["Pendulum-v1"]
    settings = zoo_hyperparams("TD3", "Pendulum-v1")
    noise = settings.hyperparams["action_noise"]
    assert raw["noise_type"] == "normal" and isinstance(noise, NormalActionNoise)
    assert np.allclose(noise._sigma, [raw["noise_std"]]) and noise._sigma.shape == (1,)  # Pendulum: 1 action
    assert "noise_type" not in settings.hyperparams and "noise_std" not in settings.hyperparams
    assert (settings.noise_type, settings.noise_std) == ("normal", raw["noise_std"])  # the entry's own values
    assert settings.hyperparams["policy_kwargs"] == {"net_arch": [400, 300]}


def test_an_entry_without_noise_says_so():
    raw = zoo_yaml("dqn")["CartPole-v1"]
    assert "noise_type" not in raw
    settings = zoo_hyperparams("DQN", "CartPole-v1")
    assert settings.noise_type is None and settings.noise_std is None


def test_the_zoo_s_settings_build_the_sb3_model_they_describe():
    from rlq.rl.agents import make_model

    settings = zoo_hyperparams("PPO", "CartPole-v1")
    model = make_model("PPO", "CartPole-v1", n_envs=settings.n_envs, hyperparams=settings.hyperparams)
    assert model.n_envs == 8 and model.n_steps == 32 and model.n_epochs == 20
    assert model.lr_schedule(1.0) == pytest.approx(1e-3) and model.lr_schedule(0.25) == pytest.approx(2.5e-4)


def test_settings_rlq_cannot_honour_raise():
    assert zoo_yaml("ppo")["Acrobot-v1"]["normalize"] is True
    with pytest.raises(ZooSettingError, match="normalize"):
        zoo_hyperparams("PPO", "Acrobot-v1")


def test_an_unknown_pair_lists_what_the_zoo_tunes():
    with pytest.raises(ZooSettingError, match="no DQN settings for 'NoSuchEnv-v0'.*CartPole-v1"):
        zoo_hyperparams("DQN", "NoSuchEnv-v0")
    assert set(zoo_env_ids("DQN")) == set(zoo_yaml("dqn"))
    with pytest.raises(ValueError, match="unknown algorithm"):
        zoo_hyperparams("NOPE", "CartPole-v1")


def test_atari_ids_use_the_zoo_s_atari_entry():
    raw = zoo_yaml("ppo")["atari"]
    settings = zoo_hyperparams("PPO", "BreakoutNoFrameskip-v4")
    assert settings.policy == raw["policy"] == "CnnPolicy" and settings.n_envs == raw["n_envs"]
    assert "frame_stack" not in settings.hyperparams and "env_wrapper" not in settings.hyperparams


def test_policy_kwargs_are_parsed_without_eval():
    assert parse_policy_kwargs("dict(net_arch=dict(pi=[64], vf=[64]), log_std_init=-2)") == {
        "net_arch": {"pi": [64], "vf": [64]},
        "log_std_init": -2,
    }
    assert parse_policy_kwargs("dict(activation_fn=nn.ReLU, ortho_init=False)") == {
        "activation_fn": nn.ReLU,
        "ortho_init": False,
    }
    with pytest.raises(ZooSettingError, match="does not know"):
        parse_policy_kwargs("dict(x=__import__('os').getcwd())")
    with pytest.raises(ZooSettingError, match="not a dict"):
        parse_policy_kwargs("[1, 2]")


def test_schedules_pickle_into_worker_processes():
    import pickle

    schedule = pickle.loads(pickle.dumps(LinearSchedule(0.5)))
    assert schedule(0.5) == 0.25
