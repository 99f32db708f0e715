"""D4PG: the categorical projection, the SB3 algorithm on its own, and as ActorQ's learner."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlq.actorq import ActorQConfig, train
from rlq.actorq.d4pg import D4PG, categorical_projection
from rlq.quant.latency import torch_threads

SUPPORT = torch.linspace(-10.0, 10.0, 11)  # atoms 2 apart


def random_probs(batch: int = 4) -> torch.Tensor:
    return torch.softmax(
        torch.randn(batch, SUPPORT.numel(), generator=torch.Generator().manual_seed(0)), dim=1
    )


def test_projection_identity_and_shift():
    probs = random_probs()
    zeros, ones = torch.zeros(4, 1), torch.ones(4, 1)
    torch.testing.assert_close(categorical_projection(probs, zeros, ones, SUPPORT), probs)
    shifted = categorical_projection(probs, torch.full((4, 1), 2.0), ones, SUPPORT)  # one atom up
    torch.testing.assert_close(shifted[:, 1:-1], probs[:, :-2])
    torch.testing.assert_close(shifted[:, -1], probs[:, -2] + probs[:, -1])  # clipped at v_max
    assert shifted[:, 0].abs().max() == 0


def test_projection_terminal_and_mass():
    probs = random_probs()
    terminal = categorical_projection(probs, torch.full((4, 1), 3.0), torch.zeros(4, 1), SUPPORT)
    expected = torch.zeros(4, SUPPORT.numel())
    expected[:, 6], expected[:, 7] = 0.5, 0.5  # 3.0 lies halfway between atoms 2 and 4
    torch.testing.assert_close(terminal, expected)
    mixed = categorical_projection(probs, torch.randn(4, 1) * 5, torch.rand(4, 1), SUPPORT)
    torch.testing.assert_close(mixed.sum(dim=1), torch.ones(4))
    assert (mixed >= 0).all()


def test_d4pg_trains_saves_and_loads(tmp_path):
    from rlq.rl.agents import quiet_logger
    from rlq.rl.envs import make_vec_env

    env = make_vec_env("Pendulum-v1", n_envs=1, seed=0)
    model = D4PG("MlpPolicy", env, n_steps=3, n_atoms=21, v_min=-20, v_max=0, learning_starts=50,
                 batch_size=16, policy_kwargs={"net_arch": [16]}, seed=0)  # fmt: skip
    model.set_logger(quiet_logger(None))
    with torch_threads(1):  # tiny networks: a second thread only waits on a busy 2-core machine
        model.learn(120)
    assert model.critic.q_net[-1].out_features == 21 and model.replay_buffer.n_steps == 3
    obs = env.reset()
    model.save(tmp_path / "d4pg.zip")
    loaded = D4PG.load(tmp_path / "d4pg.zip")
    assert loaded.n_atoms == 21 and loaded.policy.critic.n_atoms == 21
    np.testing.assert_allclose(
        loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0]
    )
    with pytest.raises(ValueError, match="v_min"):
        D4PG("MlpPolicy", env, v_min=1.0, v_max=0.0)


def test_d4pg_as_actorq_learner_with_resume(tmp_path):
    config = ActorQConfig(
        env_id="Pendulum-v1", algorithm="D4PG", n_actors=2, hidden_sizes=(32, 32), batch_size=32,
        learner_steps=40, learning_starts=200, samples_per_insert=8.0, update_period=20, eval_every=20,
        eval_episodes=1, torch_threads=1, actor_backend="onnx", checkpoint_dir=str(tmp_path), checkpoint_every=20,
        hyperparams={"n_steps": 5, "v_min": -150.0, "v_max": 0.0},
    )  # fmt: skip
    result = train(config, callback=lambda p: p.learner_steps < 20)
    assert result.learner_steps == 20 and isinstance(result.model, D4PG)
    resumed = train(config)
    assert resumed.resumed_from == 20 and resumed.learner_steps == 40 and resumed.model.v_min == -150.0
    assert list(resumed.history["learner_steps"]) == [0, 20, 40]


def test_d4pg_learner_beats_its_initial_policy_on_cartpole_swingup():
    """The fixed learner (near-zero output layer, clipped gradients, noise 0.3) improves a small DMC task's return.

    cartpole-swingup starts with the pole down: the untrained near-zero policy scores about 0 there, and a
    learner that learns anything at all (swinging the pole) raises the return well beyond it.
    """
    config = ActorQConfig(
        env_id="dm_control/cartpole-swingup-v0", algorithm="D4PG", n_actors=1, hidden_sizes=(32, 32),
        critic_hidden_sizes=(32, 32), batch_size=64, samples_per_insert=64.0, learning_rate=1e-3,
        learner_steps=1000, learning_starts=500, update_period=20, eval_every=1000, eval_episodes=1,
        torch_threads=1, actor_backend="torch", seed=0, hyperparams={"n_steps": 5, "v_min": -150.0, "v_max": 150.0},
    )  # fmt: skip
    result = train(config)
    returns = result.history["eval_return"].to_numpy()
    assert list(result.history["learner_steps"]) == [0, 1000]
    assert returns[0] < 5.0, returns  # the initial policy barely moves the cart
    assert returns[-1] > returns[0] + 25.0, returns
    assert result.history["actor_saturated_share"].iloc[-1] < 0.99  # the policy's tanh is not stuck at +-1
