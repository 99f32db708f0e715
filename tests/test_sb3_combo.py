"""GST or gradual pruning trained together with QAT in one ``learn``: QAT quantizes what the compression stores."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stable_baselines3.common.callbacks import BaseCallback

from conftest import interrupt_at
from rlq.compress import circulant_vectors, expand_circulant, is_block_circulant
from rlq.compress.block_circulant import stored_target
from rlq.compress.masks import mask_of, stored_tensor
from rlq.compress.measures import layer_kind
from rlq.quant import WeightFakeQuant, convert_qat_, is_qat
from rlq.rl.agents import make_model
from rlq.rl.evaluate import evaluate
from rlq.sb3.gst_callback import GSTCallback
from rlq.sb3.networks import optimizers
from rlq.sb3.pruning_callback import GradualPruningCallback
from rlq.sb3.qat_callback import QATCallback
from rlq.sb3.qat_policy import convert_policy_qat_

#: rewards never count as a drop: the reward-aware target rises at every update (deterministic tests)
ALWAYS_HOLDS = {"window": 1, "step_size": 0.1, "max_sparsity": 0.9, "abs_tolerance": 1e9}
BITS = 4
LEVELS = 2**BITS - 1  # symmetric restricted range: codes -(2^(b-1) - 1) .. 2^(b-1) - 1


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one PyTorch thread per test


def tiny(algo: str):
    hyper: dict = {"policy_kwargs": {"net_arch": [16, 16]}}
    if algo in ("TD3", "SAC", "DQN"):
        hyper |= {"learning_starts": 40, "buffer_size": 1000, "batch_size": 16}
    if algo == "DQN":
        hyper |= {"target_update_interval": 10, "train_freq": 2, "gradient_steps": 1}
    if algo == "PPO":
        hyper |= {"n_steps": 32, "batch_size": 16, "n_epochs": 2}
    env_id = "Pendulum-v1" if algo in ("TD3", "SAC") else "CartPole-v1"
    return env_id, make_model(algo, env_id, seed=0, hyperparams=hyper)


class ScriptedGST(GSTCallback):
    """GST fed a constant score at every step, so its reward-aware target rises at every update."""

    def _scores(self) -> list[float]:
        return [1.0]


def gst(algo: str, **overrides) -> GSTCallback:
    """Return GST over 240 steps: B=4, B=2 from 25%, pruning from 25%, hand-over at 50% of training."""
    settings = dict(
        total_steps=240,
        block_schedule=((0.0, 4), (0.25, 2)),
        transition_method="projection" if algo == "SAC" else "exact",  # SAC's trunk feeds two heads
        bc_end=0.5,
        s_shift=0.5,
        prune_every=10,
        sparsity=ALWAYS_HOLDS,
    )
    return ScriptedGST(**(settings | overrides))


def pruning() -> GradualPruningCallback:
    return GradualPruningCallback(final_sparsity=0.75, start_fraction=0.1, end_fraction=0.6, update_every=10)


def rows_of(values: torch.Tensor) -> torch.Tensor:
    """Return ``values`` as one row per output channel (dense weight) or per block row (B-vectors)."""
    return values.detach().reshape(values.shape[0], -1)


def assert_levels(values: torch.Tensor, what: str) -> None:
    for row in rows_of(values):
        assert row.unique().numel() <= LEVELS, f"{what}: {row.unique().numel()} levels"


def dense_mask(layer) -> torch.Tensor | None:
    """Return the 0/1 pattern of the dense weight that the layer's mask forces to zero, if pruned."""
    mask = mask_of(*stored_target(layer))
    if mask is None:
        return None
    return expand_circulant(mask) if is_block_circulant(layer) else mask


def assert_quantized_and_masked(policy, names) -> None:
    """Every QAT layer's weight has at most 2^bits - 1 levels per output channel; masked entries are 0."""
    for name in names:
        layer = policy.get_submodule(name)
        weight = layer.weight.detach()
        assert_levels(weight, name)
        mask = dense_mask(layer)
        if mask is not None:
            assert (weight[mask == 0] == 0).all(), f"{name}: a pruned entry is not zero"


def assert_stored_values_quantized(policy, names) -> None:
    """After conversion the stored values themselves (B-vectors per block row, dense rows) take few levels."""
    for name in names:
        layer = policy.get_submodule(name)
        target, tensor_name = stored_target(layer)
        mask = mask_of(target, tensor_name)
        stored = stored_tensor(target, tensor_name).detach()
        if is_block_circulant(layer):
            assert torch.equal(circulant_vectors(layer), stored if mask is None else stored * mask)
        assert_levels(stored, name)
        if mask is not None:
            assert (stored[mask == 0] == 0).all(), f"{name}: a pruned stored value is not zero"


class Invariants(BaseCallback):
    """Checks, every ``every`` steps, that QAT stays on top of the compression of every quantized layer."""

    def __init__(self, qat: QATCallback, every: int = 10):
        super().__init__()
        self.qat, self.every = qat, every
        self.kinds: set[str] = set()

    def _on_step(self) -> bool:
        if self.num_timesteps % self.every:
            return True
        policy = self.model.policy
        for name in self.qat.layers:
            layer = policy.get_submodule(name)
            stack = list(layer.parametrizations["weight"])
            assert isinstance(stack[-1], WeightFakeQuant), name
            assert sum(isinstance(p, WeightFakeQuant) for p in stack) == 1, name
            assert stack[-1].enabled == self.qat.enabled, name
            self.kinds.add(layer_kind(layer))
        if self.qat.enabled:
            assert_quantized_and_masked(policy, self.qat.layers)
        live = {id(p) for p in policy.parameters()}
        for optimizer in optimizers(policy):
            assert all(id(p) in live for group in optimizer.param_groups for p in group["params"])
        return True


def sample_obs(model, n: int = 32) -> torch.Tensor:
    model.observation_space.seed(0)
    return np.stack([model.observation_space.sample() for _ in range(n)])


def check_conversion(model, env_id, names, convert=convert_policy_qat_) -> None:
    """The fake-quantized policy and its conversion act and return exactly alike (same episodes)."""
    obs = sample_obs(model)
    before = model.predict(obs, deterministic=True)[0]
    returns = evaluate(model, env_id, n_episodes=1, seed=3).returns
    convert(model.policy)
    assert not is_qat(model.policy)
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], before)
    assert evaluate(model, env_id, n_episodes=1, seed=3).returns == returns
    assert_quantized_and_masked(model.policy, names)


@pytest.mark.parametrize(
    ("algo", "qat_first"), [("TD3", True), ("TD3", False), ("SAC", True), ("PPO", False), ("DQN", True)]
)
def test_gst_and_qat_in_one_learn(algo, qat_first):
    env_id, model = tiny(algo)
    qat = QATCallback(bits=BITS, delay_steps=0, convert_at_end=False)
    compression = gst(algo)
    invariants = Invariants(qat)
    model.learn(240, callback=[qat, compression, invariants] if qat_first else [compression, qat, invariants])
    kinds = set(compression.events["kind"])
    assert {"block_circulant", "transition", "hand_over", "prune"} <= kinds
    assert {"block_circulant", "block_circulant+pruned", "pruned", "dense"} <= invariants.kinds
    assert compression.compression_ratio() > 0.5  # masks beneath QAT are counted
    assert_quantized_and_masked(model.policy, qat.layers)
    check_conversion(model, env_id, qat.layers)


@pytest.mark.parametrize("algo", ["TD3", "PPO"])
def test_gradual_pruning_and_qat_in_one_learn(algo):
    env_id, model = tiny(algo)
    qat = QATCallback(bits=BITS, delay_steps=0, convert_at_end=False)
    compression = pruning()
    invariants = Invariants(qat)
    model.learn(240, callback=[qat, compression, invariants])
    assert compression.compression_ratio() > 0.5
    assert "pruned" in invariants.kinds
    assert_quantized_and_masked(model.policy, qat.layers)
    check_conversion(model, env_id, qat.layers)


def test_block_circulant_layers_convert_to_quantized_b_vectors():
    """Before the hand-over, conversion keeps the layers block-circulant, their B-vectors quantized."""
    env_id, model = tiny("TD3")
    qat = QATCallback(bits=BITS, delay_steps=0)  # converts at the end of learn
    compression = gst("TD3", bc_end=1.0, s_shift=0.25)  # no hand-over: block-circulant to the end
    model.learn(240, callback=[qat, compression])
    assert not is_qat(model.policy)
    circulant = [n for n in qat.layers if is_block_circulant(model.policy.get_submodule(n))]
    pruned = [n for n in circulant if mask_of(*stored_target(model.policy.get_submodule(n))) is not None]
    assert circulant and pruned
    assert_stored_values_quantized(model.policy, qat.layers)
    assert_quantized_and_masked(model.policy, qat.layers)


def test_pruned_layers_convert_to_quantized_unpruned_values():
    _, model = tiny("TD3")
    qat = QATCallback(bits=BITS, delay_steps=0)
    model.learn(240, callback=[pruning(), qat])
    assert_stored_values_quantized(model.policy, qat.layers)
    assert any(mask_of(*stored_target(model.policy.get_submodule(n))) is not None for n in qat.layers)


def test_quantization_delay_survives_structural_changes():
    """QAT switched off until after the hand-over stays off through every lift, then switches on."""
    _, model = tiny("TD3")
    qat = QATCallback(bits=BITS, delay_steps=180, convert_at_end=False)
    invariants = Invariants(qat, every=5)
    model.learn(240, callback=[qat, gst("TD3"), invariants])
    assert [h["enabled"] for h in qat.history] == [False, True]
    assert 180 <= qat.history[1]["step"] < 185
    assert_quantized_and_masked(model.policy, qat.layers)


def test_torch_style_conversion_also_acts_alike():
    """``rlq.quant.convert_qat_`` (which bakes the compression too) computes the same actions."""
    env_id, model = tiny("TD3")
    qat = QATCallback(bits=BITS, delay_steps=0, convert_at_end=False)
    model.learn(240, callback=[qat, gst("TD3")])
    check_conversion(model, env_id, qat.layers, convert=convert_qat_)


def test_trained_sparse_low_bit_actor_exports_packed_and_to_onnx(tmp_path):
    """GST + 8-bit QAT, converted: bits per weight measured, packed file round trip, int8 ONNX parity."""
    from rlq.quant import OnnxPolicy, bits_per_weight, export_onnx
    from rlq.quant.size import load_packed, save_packed
    from rlq.sb3.action_path import action_network, preprocess_observations

    _, model = tiny("TD3")
    model.learn(240, callback=[QATCallback(bits=8, delay_steps=0), gst("TD3")])
    net, _ = action_network(model)
    bits = bits_per_weight(net)
    assert bits < 8.0  # converted layers are marked 8-bit; the middle one is pruned too
    _, fresh_model = tiny("TD3")
    fresh, _ = action_network(fresh_model)
    fresh.load_state_dict(load_packed(save_packed(net, tmp_path / "actor.rlqp")))
    obs = preprocess_observations(model, sample_obs(model, 256))
    with torch.no_grad():
        a_torch = net(obs)
        torch.testing.assert_close(fresh(obs), a_torch, rtol=0, atol=1e-6)
    onnx = OnnxPolicy(export_onnx(fresh.eval(), tmp_path / "actor.onnx", obs[:1], precision="int8"))
    half_range = torch.as_tensor((model.action_space.high - model.action_space.low) / 2)
    # batch 1, as an actor acts: ONNX Runtime's dynamic int8 quantizes activations over each batch's range
    a_onnx = torch.cat([torch.as_tensor(np.asarray(onnx(o[None]))) for o in obs])
    error = ((a_onnx - a_torch).abs() * half_range).max()
    # within 0.5% of the action range (0.02 of Pendulum's 4): a few 8-bit activation steps over three layers;
    # on x86 without VNNI the export stores 7-bit weights (reduce_range), whose steps are twice as coarse: 1%
    from rlq.core.cpu import int8_needs_reduced_range

    bound = (0.01 if int8_needs_reduced_range() else 0.005) * float(2 * half_range.max())
    assert float(error) <= bound, f"int8 ONNX differs by {float(error):.4f} action units (bound {bound:.3f})"


def test_interrupted_combined_run_resumes_from_its_checkpoint(tmp_path):
    """A checkpoint holds the compressed float policy; on resume QAT stacks on top of it again."""
    from rlq.rl.agents import train_agent
    from rlq.sb3.checkpoint import CompressedCheckpoints

    hyper = {
        "policy_kwargs": {"net_arch": [16, 16]},
        "learning_starts": 40,
        "buffer_size": 1000,
        "batch_size": 16,
    }

    def fresh():
        return make_model("TD3", "Pendulum-v1", hyperparams=hyper)

    with pytest.raises(KeyboardInterrupt):  # after the hand-over: pruned dense layers beneath QAT
        train_agent(
            fresh(), 240, CompressedCheckpoints(tmp_path, 40),
            callback=[QATCallback(BITS), gst("TD3"), interrupt_at(200)],
        )  # fmt: skip
    qat, compression = QATCallback(BITS), gst("TD3")
    result = train_agent(fresh(), 240, CompressedCheckpoints(tmp_path, 40), callback=[qat, compression])
    # the checkpoint at a step follows the schedules' work at that step: the kill at 200 comes first
    assert result.resumed_from == 160 and result.model.num_timesteps == 240
    assert compression.compression_ratio() > 0.5
    assert_stored_values_quantized(result.model.policy, qat.layers)


def test_activation_quantization_composes_too():
    """Input quantizers sit on the layers, not on the weights: structural changes leave them in place.

    Their ranges keep moving while they observe (also in evaluation), so they are frozen before comparing.
    """
    from rlq.quant.activations import input_quantizers

    env_id, model = tiny("TD3")
    qat = QATCallback(bits=BITS, delay_steps=0, convert_at_end=False, activations=True)
    model.learn(240, callback=[gst("TD3"), qat, Invariants(qat)])
    quantizers = input_quantizers(model.policy)
    assert len(quantizers) == len(qat.layers) and all(q.has_range for q in quantizers)
    for quantizer in quantizers:
        quantizer.observing = False
    check_conversion(model, env_id, qat.layers)
