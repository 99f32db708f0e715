"""Does a policy saturate? ActorQ's learner against SB3's own TD3 loop, same network, lr, init and noise.

    python tools/actorq_saturation.py [env_id] [updates]     # default dm_control/cartpole-balance-v0, 2000

Prints, for ActorQ's D4PG and TD3 learners (one actor, 64x64 networks, batch 64, one update per inserted
transition after 1000 random steps) and for ``stable_baselines3.TD3.learn`` with the same settings, the
evaluation return and the policy's saturated share (|tanh| > 0.99 on recent observations) over training.
A return near 136 on cartpole-balance is a constant action's.
"""

from __future__ import annotations

import sys

import numpy as np


def actorq(env_id: str, algorithm: str, updates: int) -> None:
    from rlq.actorq import ActorQConfig, train

    config = ActorQConfig(
        env_id=env_id, algorithm=algorithm, n_actors=1, hidden_sizes=(64, 64), batch_size=64,
        learner_steps=updates, learning_starts=1000, samples_per_insert=64.0, update_period=20,
        eval_every=updates // 4, eval_episodes=2, torch_threads=1, seed=0, actor_backend="torch",
    )  # fmt: skip
    history = train(config).history
    print(f"ActorQ {algorithm}: return {[round(x, 1) for x in history['eval_return']]}, "
          f"saturated {[round(x, 3) for x in history['actor_saturated_share']]}")  # fmt: skip


def sb3_td3(env_id: str, updates: int) -> None:
    from stable_baselines3 import TD3
    from stable_baselines3.common.noise import NormalActionNoise

    from rlq.actorq.learner import near_zero_policy_output_, policy_saturation
    from rlq.rl.envs import make_vec_env

    model = TD3(
        "MlpPolicy", make_vec_env(env_id, n_envs=1, seed=0), learning_rate=1e-4, learning_starts=1000,
        batch_size=64, seed=0, policy_kwargs={"net_arch": [64, 64]},
        action_noise=NormalActionNoise(np.zeros(1), 0.3 * np.ones(1)),
    )  # fmt: skip
    near_zero_policy_output_(model, 1e-4)
    rows = []
    for _ in range(4):
        model.learn((updates + 1000) // 4, reset_num_timesteps=False)
        env, total = make_vec_env(env_id, n_envs=1, seed=100), 0.0
        obs, done = env.reset(), False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, dones, _ = env.step(action)
            total, done = total + float(reward[0]), bool(dones[0])
        recent = model.replay_buffer.observations[
            max(0, model.replay_buffer.size() - 256) : model.replay_buffer.size(), 0
        ]
        rows.append((model.num_timesteps, round(total, 1), round(policy_saturation(model, recent)[1], 3)))
    print(f"SB3 TD3.learn: (steps, return, saturated) {rows}")


if __name__ == "__main__":
    env_id = sys.argv[1] if len(sys.argv) > 1 else "dm_control/cartpole-balance-v0"
    updates = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    for algorithm in ("D4PG", "TD3"):
        actorq(env_id, algorithm, updates)
    sb3_td3(env_id, updates)
