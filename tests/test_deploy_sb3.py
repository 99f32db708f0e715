"""Compiled SB3 policies act as SB3's deterministic predict does, on states a rollout visits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import DEPLOY_ALGOS, DEPLOY_DISCRETE, circulant_deploy_models
from rlq.deploy import FP32_RTOL, compile_policy, error_bound
from rlq.rl.agents import make_model

ROOT = Path(__file__).resolve().parent.parent
ALGOS, DISCRETE = DEPLOY_ALGOS, DEPLOY_DISCRETE


@pytest.fixture(scope="module")
def models():
    """Untrained models with a 64-64 action path whose hidden layer is block-circulant (B = 8)."""
    return circulant_deploy_models(seed=2)


def rollout(env_id: str, act, steps: int = 150, seed: int = 0) -> np.ndarray:
    """Return the float32 observations of a rollout that acts with ``act`` (a batch of one at a time)."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    states = []
    for _ in range(steps):
        states.append(np.asarray(obs, np.float32))
        action = act(np.asarray(obs, np.float32)[None])[0]
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return np.stack(states)


@pytest.mark.parametrize("algo", list(ALGOS))
def test_fp32_policy_acts_as_sb3_predict_on_its_rollout(models, algo, use_kernels):
    model = models[algo]
    compiled = compile_policy(model, use_kernels=use_kernels)
    states = rollout(ALGOS[algo], compiled)
    expected, _ = model.predict(states, deterministic=True)
    actions = compiled(states)
    if algo in DISCRETE:
        assert actions.dtype == np.int64 and actions.shape == (len(states),)
        np.testing.assert_array_equal(actions, expected)
    else:
        assert actions.shape == expected.shape
        high = float(np.abs(model.action_space.high).max())
        np.testing.assert_allclose(actions, expected, rtol=0, atol=FP32_RTOL * high)


@pytest.mark.parametrize("algo", ["TD3", "SAC", "PPO", "DQN"])
def test_int8_policy_is_within_its_bound_on_the_rollout(models, algo, use_kernels):
    model = models[algo]
    compiled = compile_policy(model, "int8", use_kernels=use_kernels)
    assert [op.kernel for op in compiled.ops][1] == "circulant_int8"
    states = rollout(ALGOS[algo], compiled)
    exact, bound = error_bound(model, compiled, states)
    outputs = compiled.outputs(states)
    assert np.all(np.abs(outputs - exact) <= bound)
    expected, _ = model.predict(states, deterministic=True)
    if algo in DISCRETE:  # the greedy action is SB3's wherever the bound cannot flip it
        top2 = np.sort(exact, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 2 * bound.max(axis=1)
        np.testing.assert_array_equal(compiled(states)[clear], expected[clear])
    else:
        np.testing.assert_array_less(np.abs(compiled(states) - expected), bound + 1e-6)


def test_sb3_errors_name_what_is_unsupported():
    model = make_model("PPO", "CartPole-v1", seed=0, hyperparams=dict(policy_kwargs=dict(net_arch=[8])))
    with pytest.raises(TypeError, match="compile_policy takes an nn.Sequential or a Stable-Baselines3"):
        compile_policy(object())
    model.policy.mlp_extractor.policy_net[1] = torch.nn.SiLU()
    with pytest.raises(TypeError, match=r"unsupported layer 'latent.1' \(SiLU\)"):
        compile_policy(model)


@pytest.mark.slow
def test_the_benchmark_runs_quickly_and_prints_its_table():
    pytest.importorskip("onnxruntime")
    pytest.importorskip("mujoco")
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_compressed_policy.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for column in ("policy", "p50 us", "p99 us", "vs ORT int8", "weight KiB"):
        assert column in out, out
    assert "ORT int8 dense" in out and "circulant B=16" in out and "with env.step" in out
    assert "CPU: " in out and "by batch" in out and "batch 8: p50 us, us/row, row gain, vs ORT int8" in out
