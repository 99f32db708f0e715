"""QAT inside SB3 training: the delay works, quantization really acts, conversion leaves 2^N levels, files load."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch.nn.utils import parametrize

from conftest import interrupt_at, trained_td3_parameters
from rlq.quant import WeightFakeQuant, is_qat, set_qat_enabled
from rlq.rl.agents import algorithm_class, make_model, train_agent
from rlq.rl.envs import make_vec_env
from rlq.rl.resume import Checkpoints
from rlq.sb3.action_path import action_network, preprocess_observations
from rlq.sb3.networks import layer_chains, optimizers
from rlq.sb3.qat_callback import QATCallback
from rlq.sb3.qat_checkpoint import distinct_values, load_qat, save_qat
from rlq.sb3.qat_policy import convert_policy_qat_, qat_layers
from rlq.sb3.quantized import quantized_policy

TINY = {
    "PPO": ("CartPole-v1", dict(n_steps=64, batch_size=64, n_epochs=2)),
    "A2C": ("CartPole-v1", {}),
    "DQN": (
        "CartPole-v1",
        dict(learning_starts=64, train_freq=4, gradient_steps=1, target_update_interval=50),
    ),
    "TD3": ("Pendulum-v1", dict(learning_starts=64)),
    "DDPG": ("Pendulum-v1", dict(learning_starts=64)),
    "SAC": ("Pendulum-v1", dict(learning_starts=64)),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one thread per test, restored after


def tiny_model(algo: str, seed: int = 0):
    env_id, kw = TINY[algo]
    return make_model(algo, env_id, seed=seed, hyperparams=dict(policy_kwargs=dict(net_arch=[16]), **kw))


def sample_obs(model, n: int = 64) -> np.ndarray:
    model.observation_space.seed(0)
    return np.stack([model.observation_space.sample() for _ in range(n)])


def all_weight_layers(policy):
    return {id(m): m for chain in layer_chains(policy).values() for m in chain}.values()


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("algo", ["PPO", "TD3", "DQN"])
def test_converted_policy_has_at_most_2_to_the_n_levels(algo, bits):
    model = tiny_model(algo)
    callback = QATCallback(bits=bits, delay_steps=128)
    model.learn(320, callback=callback)
    assert callback.history[0] == {"step": 0, "enabled": False}
    assert callback.history[1]["enabled"] and 128 <= callback.history[1]["step"] < 128 + 64
    assert not is_qat(model.policy)  # converted: plain parameters again
    layers = list(all_weight_layers(model.policy))
    assert len(callback.layers) == len(layers)  # every layer of every network, targets included
    for layer in layers:
        assert type(layer.weight) is torch.nn.Parameter
        assert distinct_values(layer, per_channel=True) <= 2**bits


def test_per_tensor_conversion():
    model = tiny_model("PPO")
    model.learn(128, callback=QATCallback(bits=3, per_channel=False))
    for layer in all_weight_layers(model.policy):
        assert distinct_values(layer) <= 2**3


def test_target_networks_are_quantized_like_the_online_ones():
    model = tiny_model("TD3")
    model.learn(160, callback=QATCallback(bits=2, delay_steps=0, convert_at_end=False))
    for name in ("actor", "critic"):
        online, target = getattr(model.policy, name), getattr(model.policy, f"{name}_target")
        shapes = [p.shape for p in online.parameters()]
        assert shapes == [p.shape for p in target.parameters()]  # polyak pairs the same tensors
        assert is_qat(online) and is_qat(target)
    for layer in all_weight_layers(model.policy):
        assert distinct_values(layer, per_channel=True) <= 3  # parametrized: the forward weight is quantized


def test_qat_is_float_before_the_delay_and_quantized_after():
    model = tiny_model("PPO")
    callback = QATCallback(bits=2, delay_steps=10**9, convert_at_end=False)
    model.learn(64, callback=callback)
    assert callback.history == [{"step": 0, "enabled": False}] and not callback.enabled
    policy = model.policy
    assert is_qat(policy)
    float_policy = tiny_model("PPO", seed=1).policy
    float_policy.load_state_dict(policy.state_dict())  # the latent float weights, under plain names
    batch = preprocess_observations(model, sample_obs(model))
    with torch.no_grad():
        quantized_net, float_net = action_network(policy)[0], action_network(float_policy)[0]
        assert torch.equal(quantized_net(batch), float_net(batch))
        assert torch.equal(policy.predict_values(batch), float_policy.predict_values(batch))
        set_qat_enabled(policy, True)
        assert not torch.allclose(quantized_net(batch), float_net(batch), atol=1e-3)
        assert not torch.allclose(policy.predict_values(batch), float_policy.predict_values(batch), atol=1e-3)


@pytest.mark.parametrize("algo", ["PPO", "A2C", "DQN", "TD3", "DDPG", "SAC"])
def test_optimizers_keep_training_the_latent_weights(algo):
    model = tiny_model(algo)
    before = {id(m): m.weight.detach().clone() for m in all_weight_layers(model.policy)}
    model.learn(256, callback=QATCallback(bits=4, delay_steps=0, convert_at_end=False))
    live = {id(p) for p in model.policy.parameters()}
    held = [p for opt in optimizers(model.policy) for g in opt.param_groups for p in g["params"]]
    assert held and all(id(p) in live for p in held)
    online = [m for name, m in qat_layers(model.policy).items() if "target" not in name]
    latent = [m.parametrizations.weight.original for m in online]
    assert all(id(w) in {id(p) for p in held} for w in latent)
    changed = [not torch.equal(m.parametrizations.weight.original, before[id(m)]) for m in online]
    assert sum(changed) >= len(changed) // 2 and any(changed)


def test_skip_first_last_leaves_the_chain_ends_in_float():
    model = make_model(
        "PPO", "CartPole-v1", hyperparams=dict(n_steps=64, batch_size=64, policy_kwargs=dict(net_arch=[8, 8]))
    )
    callback = QATCallback(bits=4, skip_first_last=True, convert_at_end=False)
    model.learn(64, callback=callback)
    chains = layer_chains(model.policy)
    ends = {id(c[i]) for c in chains.values() for i in (0, -1)}
    for layer in all_weight_layers(model.policy):
        assert parametrize.is_parametrized(layer, "weight") == (id(layer) not in ends)


def test_activation_quantization_trains_and_converts():
    model = tiny_model("SAC")
    model.learn(160, callback=QATCallback(bits=4, delay_steps=96, activations=True))
    batch = preprocess_observations(model, sample_obs(model))
    quantizers = [m.input_quantizer for m in all_weight_layers(model.policy)]
    assert all(q.has_range and q.enabled and not q.observing for q in quantizers)
    assert torch.isfinite(action_network(model)[0](batch)).all()


def test_converted_model_saves_and_loads_with_plain_sb3(tmp_path):
    model = tiny_model("DQN")
    model.learn(160, callback=QATCallback(bits=2, delay_steps=64))
    model.save(tmp_path / "dqn")
    loaded = algorithm_class("DQN").load(tmp_path / "dqn")
    saved, restored = model.policy.state_dict(), loaded.policy.state_dict()
    assert set(saved) == set(restored) and all(torch.equal(saved[k], restored[k]) for k in saved)
    obs = sample_obs(model, 200)
    np.testing.assert_array_equal(
        loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0]
    )
    assert all(distinct_values(m, per_channel=True) <= 4 for m in all_weight_layers(loaded.policy))


@pytest.mark.parametrize("algo", ["PPO", "TD3"])
def test_model_during_qat_saves_latent_weights_and_save_qat_restores_it(algo, tmp_path):
    model = tiny_model(algo)
    model.learn(192, callback=QATCallback(bits=4, delay_steps=64, convert_at_end=False, activations=True))
    assert is_qat(model.policy)
    # plain SB3 load of a parametrized policy: the float latent weights, no quantizers
    model.save(tmp_path / "plain")
    plain = algorithm_class(algo).load(tmp_path / "plain")
    assert not is_qat(plain.policy)
    for name, layer in qat_layers(model.policy).items():
        assert torch.equal(plain.policy.get_submodule(name).weight, layer.parametrizations.weight.original)
    # save_qat / load_qat: the model as it was, quantizers, switches and activation ranges included
    path = save_qat(model, tmp_path / "qat")
    env_id = TINY[algo][0]
    restored = load_qat(algo, path, env=make_vec_env(env_id, seed=0))
    assert is_qat(restored.policy)
    for name, layer in qat_layers(model.policy).items():
        other = restored.policy.get_submodule(name)
        (quantizer,) = other.parametrizations.weight
        assert isinstance(quantizer, WeightFakeQuant) and quantizer.bits == 4 and quantizer.enabled
        assert torch.equal(other.input_quantizer.min_val, layer.input_quantizer.min_val)
    obs = sample_obs(model, 100)
    np.testing.assert_array_equal(
        restored.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0]
    )
    restored.learn(64, callback=QATCallback(bits=4))  # training goes on from the restored state
    assert not is_qat(restored.policy)


def test_interrupted_qat_run_resumes_from_its_checkpoint(tmp_path):
    hyperparams = dict(policy_kwargs=dict(net_arch=[16]), learning_starts=32)
    with pytest.raises(KeyboardInterrupt):
        train_agent(
            make_model("TD3", "Pendulum-v1", hyperparams=hyperparams), 320, Checkpoints(tmp_path, 64),
            callback=[QATCallback(bits=2, delay_steps=100), interrupt_at(200)],
        )  # fmt: skip
    callback = QATCallback(bits=2, delay_steps=100)
    result = train_agent(
        make_model("TD3", "Pendulum-v1", hyperparams=hyperparams), 320, Checkpoints(tmp_path, 64), callback
    )
    assert result.resumed_from == 192 and result.model.num_timesteps == 320
    assert callback.history == [{"step": 192, "enabled": True}]  # the delay had passed: on from the start
    assert all(distinct_values(m, per_channel=True) <= 3 for m in all_weight_layers(result.model.policy))
    final = algorithm_class("TD3").load(result.checkpoint)
    assert all(distinct_values(m, per_channel=True) <= 3 for m in all_weight_layers(final.policy))


@pytest.mark.parametrize("algo", ["TD3", "SAC", "DQN", "PPO"])
def test_action_path_qat_quantizes_what_is_deployed_and_its_target_twin_only(algo):
    """networks="action_path": the deployed action path (and the target twin polyak pairs with it) is quantized,
    the critics and value head train in float; the converted actor then takes at most 2^bits values a channel."""
    model = tiny_model(algo)
    callback = QATCallback(bits=3, delay_steps=0, networks="action_path")
    model.learn(160, callback=callback)
    path, _ = action_network(model)
    on_path = {id(m) for m in path.modules()}
    twins = {"TD3": "actor_target.", "DQN": "q_net_target."}
    names = dict(model.policy.named_modules())
    expected = {n for n, m in names.items() if id(m) in on_path and isinstance(m, torch.nn.Linear)}
    expected |= {
        n
        for n in names
        if algo in twins and n.startswith(twins[algo]) and isinstance(names[n], torch.nn.Linear)
    }
    assert set(callback.layers) == expected and expected
    assert not any(
        n.startswith(("critic", "qf", "value_net", "mlp_extractor.value_net")) for n in callback.layers
    )
    for name in expected:
        assert distinct_values(names[name], per_channel=True) <= 2**3
    critic_layers = [
        m
        for n, m in names.items()
        if n.startswith(("critic.", "value_net")) and isinstance(m, torch.nn.Linear)
    ]
    assert all(distinct_values(m) > 2**3 for m in critic_layers)  # float, not quantized


def test_bad_arguments():
    with pytest.raises(ValueError, match="networks"):
        QATCallback(bits=4, networks="critic")
    with pytest.raises(ValueError, match="bits"):
        QATCallback(bits=1)
    with pytest.raises(ValueError, match="delay_steps"):
        QATCallback(bits=4, delay_steps=-1)


def test_ptq_at_the_qat_bits_acts_as_the_converted_policy():
    # How the notebooks evaluate a QAT policy: ptq at its bits is the conversion, and is idempotent on it
    model = tiny_model("TD3")
    model.learn(160, callback=QATCallback(bits=3, delay_steps=0, convert_at_end=False))
    during = quantized_policy(model, "int3", per_channel_linear=True)
    convert_policy_qat_(model.policy)
    after = quantized_policy(model, "int3", per_channel_linear=True)
    obs = sample_obs(model, 200)
    converted = model.predict(obs, deterministic=True)[0]
    np.testing.assert_allclose(during.predict(obs)[0], converted, atol=1e-5)
    np.testing.assert_allclose(after.predict(obs)[0], converted, atol=1e-5)


def test_a_policy_prepared_at_other_bits_is_refused():
    model = tiny_model("PPO")
    model.learn(64, callback=QATCallback(bits=4, convert_at_end=False))
    with pytest.raises(ValueError, match="already prepared for QAT at \\[4\\] bits"):
        model.learn(64, callback=QATCallback(bits=2))
    model.learn(64, callback=QATCallback(bits=4))  # the same bits: training goes on
    assert not is_qat(model.policy)


# ---- the memoized quantizer: reused only while its input is unchanged bit for bit


def test_memoized_quantizer_gives_the_parents_bits_and_gradient():
    from stable_baselines3.common.utils import polyak_update

    from rlq.sb3.qat_stacking import MemoizedWeightFakeQuant

    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(8, 5))
    weight.data[0, 0] = -0.0
    ours, reference = MemoizedWeightFakeQuant(3, 0), WeightFakeQuant(3, 0)

    def check():
        with torch.no_grad():
            first, again, expected = ours(weight), ours(weight), reference(weight)
            assert ours(weight) is again  # a hit gives back the stored tensor
        assert torch.equal(first.view(torch.int32), expected.view(torch.int32))
        for module in (ours, reference):
            (grad,) = torch.autograd.grad((module(weight) * torch.arange(40.0).view(8, 5)).sum(), weight)
            assert torch.equal(grad, torch.arange(40.0).view(8, 5))  # straight through, on a hit too
        assert torch.equal(ours(weight).view(torch.int32), reference(weight).view(torch.int32))

    check()
    with torch.no_grad():  # written through .data (as polyak_update does): no version bump, new bits
        polyak_update([torch.randn(8, 5)], [weight], 0.5)
    check()
    weight.grad = torch.ones_like(weight)
    torch.optim.SGD([weight], lr=0.1).step()
    check()
    ours.bits = reference.bits = 5  # other settings: quantized anew
    check()
    ours.enabled = reference.enabled = False
    with torch.no_grad():
        assert torch.equal(ours(weight), weight)


@pytest.mark.parametrize("compression", ["none", "gst"])
def test_td3_with_qat_trains_bit_for_bit_as_without_the_memo(monkeypatch, compression):
    from rlq.compress.expansion_cache import ExpansionCache, TensorMemo
    from rlq.sb3.gst_callback import GSTCallback

    def train():
        callbacks = [QATCallback(4, delay_steps=60, convert_at_end=False)]
        if compression == "gst":
            callbacks.append(GSTCallback(total_steps=160, block_schedule=((0.0, 4), (0.5, 2)), bc_end=0.75))
        return trained_td3_parameters(callbacks)

    hits = []
    get = TensorMemo.get

    def counting_get(self, x):
        value = get(self, x)
        hits.append(value is not None)
        return value

    monkeypatch.setattr(TensorMemo, "get", counting_get)
    memoized = train()
    assert sum(hits) > len(hits) / 3
    monkeypatch.setattr(TensorMemo, "get", lambda self, x: None)
    monkeypatch.setattr(ExpansionCache, "vectors_of", lambda self, dense: None)  # quantize the dense weight
    plain = train()
    for a, b in zip(memoized, plain, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("axis", [0, None], ids=["per-channel", "per-tensor"])
@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_quantizing_the_vectors_of_a_block_circulant_layer_gives_the_dense_bits(kind, axis):
    """QAT above a block-circulant layer quantizes its B-vectors: same bits and gradient as on the dense weight."""
    from rlq.compress import block_circulant_
    from rlq.compress.expansion_cache import ExpansionCache
    from rlq.sb3.qat_stacking import MemoizedWeightFakeQuant, stack_fake_quant_

    torch.manual_seed(0)
    if kind == "linear":
        net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Linear(16, 12), torch.nn.Linear(12, 2))
        x = torch.randn(5, 3)
    else:
        net = torch.nn.Sequential(
            torch.nn.Conv2d(2, 8, 1), torch.nn.Conv2d(8, 12, 3), torch.nn.Conv2d(12, 1, 1)
        )
        x = torch.randn(2, 2, 6, 6)
    block_circulant_(net, 4)
    net[1].parametrizations.weight.original.data[0, 0, 0] = -0.0  # a signed zero survives as in the parent
    reference = copy.deepcopy(net)
    stack_fake_quant_(net[1], [MemoizedWeightFakeQuant(3, axis)])
    stack_fake_quant_(reference[1], [WeightFakeQuant(3, axis)])
    quantizer = net[1].parametrizations.weight[1]
    assert isinstance(quantizer.expansion, ExpansionCache)
    calls = []
    vectors_of = quantizer.expansion.vectors_of
    quantizer.expansion.vectors_of = lambda dense: calls.append(vectors_of(dense)) or calls[-1]
    for _ in range(3):
        with torch.no_grad():
            ours, theirs = net[1].weight, reference[1].weight
        assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))
        grads = []
        for module in (net, reference):
            module.zero_grad()
            module(x).square().sum().backward()
            grads.append([p.grad.clone() for p in module.parameters()])
        for a, b in zip(*grads, strict=True):
            assert torch.equal(a, b)
        with torch.no_grad():
            for module in (net, reference):
                for p in module.parameters():
                    p.sub_(0.05 * p.grad)
    assert any(v is not None for v in calls)  # the vectors path ran


def test_qat_state_reaches_tensorboard_through_sb3s_logger(tmp_path):
    """qat/bits and qat/active are recorded with SB3's own keys, into the events file of the run folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlq.rl.agents import train_agent

    env_id, hyper = "Pendulum-v1", {"learning_starts": 40, "buffer_size": 500, "batch_size": 16,
                                    "policy_kwargs": {"net_arch": [16, 16]}}  # fmt: skip
    train_agent(make_model("TD3", env_id, hyperparams=hyper), 1000, Checkpoints(tmp_path),
                callback=QATCallback(bits=6, delay_steps=900))  # fmt: skip
    events = EventAccumulator(str(tmp_path / "sb3")).Reload()
    assert {"qat/bits", "qat/active", "rollout/ep_rew_mean", "train/critic_loss"} <= set(
        events.Tags()["scalars"]
    )
    active = [e.value for e in events.Scalars("qat/active")]
    assert active == [0.0, 1.0]  # SB3 dumps every 4 episodes (800 steps), and rlq at the end
    assert {e.value for e in events.Scalars("qat/bits")} == {6.0}
