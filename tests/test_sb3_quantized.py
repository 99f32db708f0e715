"""SB3 models at any precision: quantized copies keep SB3's predict, leave the model alone, and really quantize."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn

from rlq.quant import model_size_bytes
from rlq.rl.agents import make_model
from rlq.sb3.action_path import action_network, preprocess_observations
from rlq.sb3.quantized import (
    QuantizedPolicy,
    collect_observations,
    make_policy,
    network_spaces,
    policy_sizes,
    quantized_policy,
)

ALGOS = {
    "A2C": ("Pendulum-v1", {}),
    "PPO": ("CartPole-v1", dict(n_steps=64, batch_size=64)),
    "DQN": ("CartPole-v1", {}),
    "TD3": ("Pendulum-v1", {}),
    "DDPG": ("Pendulum-v1", {}),
    "SAC": ("Pendulum-v1", {}),
}
DISCRETE = {"PPO", "DQN"}


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    return {
        algo: make_model(algo, env_id, seed=3, hyperparams=dict(policy_kwargs=dict(net_arch=[32, 32]), **kw))
        for algo, (env_id, kw) in ALGOS.items()
    }


@pytest.fixture(scope="module")
def observations():
    return {env_id: collect_observations(env_id, 400, seed=1) for env_id in {"CartPole-v1", "Pendulum-v1"}}


def _obs(observations, algo):
    return observations[ALGOS[algo][0]]


def _disagreement(algo: str, a: np.ndarray, b: np.ndarray) -> float:
    # discrete: share of different actions; continuous: mean change relative to the actions' mean size
    return float((a != b).mean()) if algo in DISCRETE else float(np.abs(a - b).mean() / np.abs(b).mean())


@pytest.mark.parametrize("algo", list(ALGOS))
def test_fp32_copy_predicts_exactly_as_sb3(models, observations, algo):
    model, obs = models[algo], _obs(observations, algo)
    policy = quantized_policy(model, "fp32")
    assert isinstance(policy, QuantizedPolicy)
    expected = model.predict(obs, deterministic=True)[0]
    got = policy.predict(obs)[0]
    assert got.shape == expected.shape and got.dtype.kind == expected.dtype.kind
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    single, state = policy.predict(obs[0])  # one observation: no batch dimension, as SB3
    assert state is None
    np.testing.assert_allclose(single, model.predict(obs[0], deterministic=True)[0], rtol=1e-6, atol=1e-6)
    if algo not in DISCRETE:  # clipped (A2C) or unscaled from tanh (TD3, DDPG, SAC) into Pendulum's [-2, 2]
        assert np.all(np.abs(got) <= 2.0)
        if algo != "A2C":
            assert np.abs(got).max() > 1.0  # beyond tanh's [-1, 1]: really unscaled


@pytest.mark.parametrize("precision", ["fp16", "int8", "int2"])
@pytest.mark.parametrize("algo", ["PPO", "TD3", "SAC"])
def test_quantizing_leaves_the_model_untouched(models, observations, algo, precision):
    model, obs = models[algo], _obs(observations, algo)
    state = copy.deepcopy(model.policy.state_dict())
    types = [type(m) for m in model.policy.modules()]
    training = model.policy.training
    before = model.predict(obs, deterministic=True)[0]
    quantized_policy(model, precision).predict(obs)
    assert [type(m) for m in model.policy.modules()] == types
    assert model.policy.training == training
    after = model.policy.state_dict()
    assert set(after) == set(state) and all(torch.equal(after[k], state[k]) for k in state)
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], before)


@pytest.mark.parametrize("algo", list(ALGOS))
def test_int8_acts_like_fp32_and_int2_does_not(models, observations, algo):
    model, obs = models[algo], _obs(observations, algo)
    fp32 = model.predict(obs, deterministic=True)[0]
    int8 = quantized_policy(model, "int8")
    assert any("quantized" in type(m).__module__ for m in int8.network.modules())  # real int8 kernels
    int2 = quantized_policy(model, "int2")
    batch = preprocess_observations(model, obs)
    reference = quantized_policy(model, "fp32").forward(batch)
    scale = reference.abs().mean()
    error8 = float((int8.forward(batch) - reference).abs().mean() / scale)
    error2 = float((int2.forward(batch) - reference).abs().mean() / scale)
    assert error8 < 0.05
    assert error2 > 5 * error8 and error2 > 0.05
    if algo in DISCRETE:
        assert _disagreement(algo, int8.predict(obs)[0], fp32) <= 0.05
        assert _disagreement(algo, int2.predict(obs)[0], fp32) > 0
    else:
        assert _disagreement(algo, int8.predict(obs)[0], fp32) < 0.05
        assert _disagreement(algo, int2.predict(obs)[0], fp32) > 0.1


def test_bit_sweep_error_shrinks_with_bits(models, observations):
    model = models["TD3"]
    batch = preprocess_observations(model, _obs(observations, "TD3"))
    reference = quantized_policy(model, "fp32").forward(batch)
    errors = [
        float((quantized_policy(model, f"int{b}").forward(batch) - reference).abs().mean())
        for b in (2, 4, 8, 12)
    ]
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-3


def test_intn_weights_take_at_most_2_to_the_n_values(models):
    policy = quantized_policy(models["DQN"], "int3")
    for layer in policy.network.modules():
        if isinstance(layer, nn.Linear):
            assert layer.weight.unique().numel() <= 2**3  # per tensor, as QuaRL


@pytest.mark.parametrize("algo", ["PPO", "TD3"])
def test_onnx_backend(models, observations, algo, tmp_path):
    model, obs = models[algo], _obs(observations, algo)
    fp32 = model.predict(obs, deterministic=True)[0]
    onnx32 = quantized_policy(model, "fp32", backend="onnx")
    np.testing.assert_allclose(onnx32.predict(obs)[0], fp32, atol=1e-5)
    onnx8 = quantized_policy(model, "int8", backend="onnx", onnx_path=tmp_path / "p.onnx")
    assert (tmp_path / "p.onnx").stat().st_size == onnx8.size_bytes
    assert _disagreement(algo, onnx8.predict(obs)[0], fp32) <= 0.05
    with pytest.raises(ValueError, match="ONNX backend"):
        quantized_policy(model, "fp16", backend="onnx")


def test_stochastic_predict_is_refused_where_sb3_would_sample(models, observations):
    with pytest.raises(ValueError, match="deterministic"):
        quantized_policy(models["PPO"], "int8").predict(_obs(observations, "PPO"), deterministic=False)
    obs = _obs(observations, "DQN")
    dqn = quantized_policy(models["DQN"], "int8")  # DQN's policy is greedy either way, as in SB3
    np.testing.assert_array_equal(dqn.predict(obs, deterministic=False)[0], dqn.predict(obs)[0])


def test_bad_input_is_rejected(models):
    with pytest.raises(TypeError, match="Stable-Baselines3"):
        quantized_policy(nn.Linear(2, 2), "int8")
    with pytest.raises(ValueError, match="unknown precision"):
        quantized_policy(models["PPO"], "int1")
    with pytest.raises(ValueError, match="backend"):
        quantized_policy(models["PPO"], "int8", backend="tensorrt")
    with pytest.raises(ValueError, match="calibration"):
        quantized_policy(models["PPO"], "int8", activations=True)


class TinyImageEnv(gym.Env):
    """Channel-last uint8 frames (SB3 transposes them) whose bright half says which action pays."""

    observation_space = gym.spaces.Box(0, 255, (36, 36, 1), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self._frame(), {}

    def _frame(self):
        frame = self.np_random.integers(0, 60, (36, 36, 1), dtype=np.uint8)
        frame[:, : self.np_random.integers(1, 36)] += 150
        return frame

    def step(self, action):
        return self._frame(), 0.0, False, False, {}


def test_cnn_policy_int8_is_static_and_calibrated():
    from stable_baselines3 import PPO

    model = PPO("CnnPolicy", TinyImageEnv(), n_steps=16, batch_size=16, seed=0, device="cpu")
    env = TinyImageEnv()
    env.reset(seed=5)
    obs = np.stack([env._frame() for _ in range(200)])  # channel-last, as the env emits them
    with pytest.raises(ValueError, match="calibration"):
        quantized_policy(model, "int8")
    int8 = quantized_policy(model, "int8", calibration_obs=obs[:64])
    assert isinstance(int8.network, torch.fx.GraphModule)  # FX static quantization of the whole path
    assert any(isinstance(m, torch.ao.nn.quantized.Conv2d) for m in int8.network.modules())
    fp32 = model.predict(obs, deterministic=True)[0]
    np.testing.assert_array_equal(quantized_policy(model, "fp32").predict(obs)[0], fp32)
    batch = preprocess_observations(model, obs)
    assert batch.shape == (200, 1, 36, 36) and float(batch.max()) <= 1.0
    reference = quantized_policy(model, "fp32").forward(batch)
    assert float((int8.forward(batch) - reference).abs().max() / reference.abs().max()) < 0.1
    onnx8 = quantized_policy(model, "int8", calibration_obs=obs[:64], backend="onnx")
    assert onnx8.predict(obs)[0].shape == fp32.shape


def test_action_network_shares_the_policy_modules(models):
    network, kind = action_network(models["SAC"])
    assert kind == "continuous" and network.head is models["SAC"].policy.actor.mu
    network, kind = action_network(models["DQN"])
    assert kind == "argmax" and network.head is models["DQN"].policy.q_net.q_net


def test_collect_observations(models):
    random_obs = collect_observations("CartPole-v1", 50, seed=0)
    assert random_obs.shape == (50, 4) and random_obs.dtype == np.float32
    np.testing.assert_array_equal(random_obs, collect_observations("CartPole-v1", 50, seed=0))
    with_model = collect_observations("CartPole-v1", 30, model=models["PPO"], seed=0)
    assert with_model.shape == (30, 4)


def test_network_spaces_and_sizes():
    obs, actions, kind = network_spaces("TD3", [17], 6)
    assert (obs.shape, actions.shape, kind) == ((17,), (6,), "MlpPolicy") and obs.dtype == np.float32
    frames, discrete, cnn = network_spaces("PPO", [84, 84, 4], 4)
    assert (frames.dtype, discrete.n, cnn) == (np.uint8, 4, "CnnPolicy")
    policy = make_policy("TD3", obs, actions, net_arch=[256, 256])
    stored = policy_sizes(policy).set_index("precision")["size_bytes"]
    assert stored["int2"] < stored["int4"] < stored["int8"] < stored["fp16"] < stored["fp32"]
    # fp32: 4 bytes per weight and bias of 17-256-256-6, and little else
    parameters = 17 * 256 + 256 + 256 * 256 + 256 + 256 * 6 + 6
    assert 4 * parameters <= stored["fp32"] < 4 * parameters + 4096


def test_quantizing_a_qat_policy_leaves_its_parametrizations_working(models, observations):
    # Regression: deep copies of a parametrized module share torch's ParametrizedLinear class; baking the
    # copy's parametrization used to delete the original's `weight` property (and converting the original
    # broke its fp32 copies).
    from rlq.sb3.qat_policy import convert_policy_qat_, prepare_policy_qat_

    model = make_model("TD3", "Pendulum-v1", seed=3, hyperparams=dict(policy_kwargs=dict(net_arch=[32, 32])))
    prepare_policy_qat_(model.policy, bits=4)
    obs = _obs(observations, "TD3")
    int4 = quantized_policy(model, "int4", per_channel_linear=True)
    fp32 = quantized_policy(model, "fp32")  # still parametrized: fake-quantized forward
    np.testing.assert_allclose(int4.predict(obs)[0], model.predict(obs, deterministic=True)[0], atol=1e-5)
    convert_policy_qat_(model.policy)
    np.testing.assert_allclose(fp32.predict(obs)[0], model.predict(obs, deterministic=True)[0], atol=1e-5)


def test_the_simulated_8_bit_point_is_sized_as_8_bit_codes(models):
    """sim8 holds float weights at 8-bit levels: its size is its weights packed at 8 bits, as int7 at 7."""
    model = models["PPO"]
    fp32, sim8, int7 = (quantized_policy(model, p).size_bytes for p in ("fp32", "sim8", "int7"))
    assert sim8 == model_size_bytes(quantized_policy(model, "fp32").network, "int8")
    assert int7 < sim8 < fp32  # (a tiny network: torch.save overhead keeps the ratio far from 4)


def test_lowest_bits_ranks_the_weights_only_widths_not_the_int8_kernels():
    import pandas as pd

    from rlq.sb3.quantized import lowest_bits_within

    rows = [
        ("fp32", 32, 0.0),
        ("int16", 16, 0.0),
        ("int12", 12, 0.0),
        ("int8", 8, -0.5),
        ("sim8", 8, 0.0),
        ("int6", 6, -0.01),
        ("int4", 4, -0.3),
    ]
    table = pd.DataFrame(rows, columns=["precision", "bits", "relative_change"])
    assert lowest_bits_within(table, 0.05) == 6  # the broken kernel int8 row does not stop the run at 12
    assert lowest_bits_within(table[table["precision"] != "sim8"], 0.05) == 6
