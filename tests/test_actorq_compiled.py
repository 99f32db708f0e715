"""ActorQ with block-circulant policies and compiled actors: broadcast of B-vectors, the compiled engine, a run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rlq.actorq import (
    ActorQConfig,
    ActorQConfigError,
    PolicyArchitecture,
    acting_sequential,
    decode_policy,
    encode_policy,
    expand_vectors,
    make_engine,
    random_policy,
    train,
)
from rlq.actorq.actor import ACTOR_TIMERS, ActorWorker, LocalPolicyStore
from rlq.actorq.broadcast import QuantizedWeight, quantize_weight
from rlq.actorq.inference import engine_backends, measure_engines
from rlq.actorq.learner import Learner
from rlq.actorq.policy import architecture_of, policy_weights
from rlq.compress import expand_circulant, is_block_circulant
from rlq.compress.masks import prune_blocks_
from rlq.deploy import FP32_RTOL, compile_policy, error_bound, kernels_available
from rlq.rl.envs import make_env
from rlq.rl.evaluate import EVAL_SEED_OFFSET

TINY = dict(
    env_id="Pendulum-v1",
    n_actors=2,
    hidden_sizes=(32, 32, 32),
    batch_size=32,
    learner_steps=40,
    learning_starts=200,
    samples_per_insert=8.0,
    update_period=20,
    eval_every=20,
    eval_episodes=1,
    torch_threads=1,
    max_insert_lead=200,
    policy_output_init=0.0,
    buffer_size=5_000,
)


def arch(block_size: int | None = 16, stochastic: bool = False, hidden=(64, 64, 64)) -> PolicyArchitecture:
    return PolicyArchitecture(5, 2, hidden, "relu", stochastic, (-1.0, -2.0), (1.0, 2.0), block_size)


def float_values(policy) -> dict[str, np.ndarray]:
    """The decoded policy's weights as floats in the form they travelled (B-vectors stay B-vectors)."""
    return {
        k: v.dequantize() if isinstance(v, QuantizedWeight) else np.asarray(v)
        for k, v in policy.weights.items()
    }


# --- configuration -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, field, message",
    [
        (dict(policy_block_size=3, hidden_sizes=(64, 64)), "policy_block_size", "does not divide hidden layer 1's 64x64"),
        (dict(policy_block_size=16, hidden_sizes=(64, 64, 24)), "policy_block_size", "hidden layer 2's 24x64"),
        (dict(policy_block_size=8, hidden_sizes=(64,)), "policy_block_size", "two hidden layers or more"),
        (dict(policy_block_size=1), "policy_block_size", "int >= 2"),
        (dict(policy_block_size="8"), "policy_block_size", "int >= 2"),
        (dict(policy_block_size=True), "policy_block_size", "int >= 2"),
        (dict(actor_backend="compiled", actor_precision="fp16"), "actor_backend", "compiled actors act at fp32 or int8"),
        (dict(actor_backend="compiled", actor_precision="int4"), "actor_backend", "not int4"),
    ],
)  # fmt: skip
def test_bad_block_size_or_compiled_precision_is_refused_naming_the_field(overrides, field, message):
    with pytest.raises(ActorQConfigError, match=f"ActorQConfig.{field}=") as caught:
        ActorQConfig(**overrides)
    assert message in str(caught.value)


def test_auto_measures_compiled_actors_for_every_policy_where_the_kernels_are_built(monkeypatch):
    assert engine_backends("int8") == engine_backends("fp32") == ("torch", "onnx", "compiled")
    assert engine_backends("fp16") == ("torch",)
    # the NumPy fallback never wins: not measured
    monkeypatch.setattr("rlq.deploy.runtime.USE_KERNELS", False)
    assert engine_backends("int8") == ("torch", "onnx")


@pytest.mark.slow
def test_auto_measures_the_compiled_engine_of_a_block_circulant_policy():
    timings = measure_engines(arch(hidden=(32, 32)), "int8", repeats=5)
    assert set(timings) == {"torch", "onnx", "compiled"}
    assert all(t["median_us"] > 0 and t["load_s"] > 0 for t in timings.values())


# --- broadcast -----------------------------------------------------------------------------------------


def test_expand_vectors_is_rlq_compress_expansion():
    vectors = np.random.default_rng(0).standard_normal((3, 2, 4)).astype(np.float32)
    expected = expand_circulant(torch.from_numpy(vectors)).numpy()
    np.testing.assert_array_equal(expand_vectors(vectors), expected)
    codes = np.arange(24, dtype=np.int8).reshape(3, 2, 4)
    np.testing.assert_array_equal(
        expand_vectors(codes), expand_circulant(torch.from_numpy(codes.astype(np.float32)))
    )


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["TD3", "SAC"])
def test_a_block_circulant_policy_broadcasts_one_bth_of_its_dense_values(algorithm):
    b = 8
    config = ActorQConfig(
        **{**TINY, "algorithm": algorithm, "hidden_sizes": (64, 64, 64), "policy_block_size": b}
    )
    model = Learner.create(config).model
    assert architecture_of(model).block_size == b
    actor = model.policy.actor
    hidden = [
        m for m in (actor.latent_pi if algorithm == "SAC" else actor.mu) if isinstance(m, torch.nn.Linear)
    ]
    hidden = hidden[:3]
    assert not is_block_circulant(hidden[0]) and all(is_block_circulant(m) for m in hidden[1:])
    if algorithm == "TD3":  # the target policy has the same structure and values
        target = [m for m in model.policy.actor_target.mu if isinstance(m, torch.nn.Linear)][:3]
        assert all(is_block_circulant(m) for m in target[1:])
        torch.testing.assert_close(
            target[1].parametrizations.weight.original, hidden[1].parametrizations.weight.original
        )
    fp32 = decode_policy(encode_policy(policy_weights(model), "fp32"))
    assert fp32.block_sizes() == {"layers.1.weight": b, "layers.2.weight": b}
    for i, layer in enumerate(hidden):
        sent = np.asarray(fp32.weights[f"layers.{i}.weight"])
        if i == 0:
            np.testing.assert_array_equal(sent, layer.weight.detach().numpy())
            continue
        stored = layer.parametrizations.weight.original.detach().numpy()
        assert sent.size * b == layer.weight.numel() and sent.size == stored.size
        np.testing.assert_array_equal(sent, stored)  # the layer's own parameters, nothing else
        np.testing.assert_array_equal(
            fp32.float_weights()[f"layers.{i}.weight"], layer.weight.detach().numpy()
        )
    dense_blob, blob = (
        encode_policy(fp32.float_weights(), "fp32"),
        encode_policy(policy_weights(model), "fp32"),
    )
    saved = 4 * sum(m.weight.numel() * (1 - 1 / b) for m in hidden[1:])
    assert len(dense_blob) - len(blob) == pytest.approx(saved, abs=256)  # header and alignment only differ


def test_int8_b_vector_codes_are_the_per_row_codes_of_the_dense_expansion():
    vectors = np.random.default_rng(1).standard_normal((4, 3, 8)).astype(np.float32)
    q = quantize_weight(vectors, 8)
    assert q.codes.shape == (4, 3, 8) and q.scale.shape == (4,)
    dense = quantize_weight(expand_vectors(vectors), 8)
    np.testing.assert_array_equal(q.expanded().codes, dense.codes)
    np.testing.assert_allclose(q.expanded().scale, dense.scale, rtol=1e-7)
    np.testing.assert_array_equal(expand_vectors(q.dequantize()), q.expanded().dequantize())
    blob = decode_policy(encode_policy({"layers.1.weight": vectors, "layers.1.bias": np.zeros(32)}, "int4"))
    back = blob.weights["layers.1.weight"]
    assert back.codes.shape == (4, 3, 8) and back.bits == 4
    np.testing.assert_array_equal(back.codes, quantize_weight(vectors, 4).codes)


# --- the compiled engine -------------------------------------------------------------------------------


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "numpy"])
@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("block_size, stochastic", [(16, False), (8, True), (None, False)])
def test_compiled_actions_are_the_torch_engines_within_compile_policys_bound(
    monkeypatch, kernels, precision, block_size, stochastic
):
    if kernels and not kernels_available():
        pytest.skip("rlq's compiled policy kernels are not built here")
    monkeypatch.setattr("rlq.deploy.runtime.USE_KERNELS", kernels)
    a = arch(block_size, stochastic)
    policy = decode_policy(encode_policy(random_policy(a, seed=3).weights, precision, version=1))
    compiled = make_engine(a, precision, "compiled")
    compiled.load(policy)
    assert compiled.policy.compiled == kernels
    reference = make_engine(a, "fp32", "torch")  # the same decoded policy, dequantized, in PyTorch
    reference.load(policy)
    obs = np.random.default_rng(4).standard_normal((64, a.obs_dim)).astype(np.float32) * 2
    exact, bound = error_bound(acting_sequential(a, float_values(policy)), compiled.policy, obs)
    got, want = compiled(obs), reference(obs)
    assert len(got) == len(want) == (2 if stochastic else 1)
    out = np.concatenate(got, axis=1)
    assert out.shape == (64, 2 * a.act_dim if stochastic else a.act_dim)
    assert np.all(np.abs(compiled.policy.outputs(obs) - exact) <= bound)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        cols = slice(i * a.act_dim, (i + 1) * a.act_dim)
        assert np.all(np.abs(g - w) <= bound[:, cols] + 1e-6), f"output {i}"  # the clamp is 1-Lipschitz
    if precision == "fp32":
        assert np.abs(out - np.concatenate(want, axis=1)).max() <= FP32_RTOL * max(1.0, np.abs(exact).max())
    else:  # int8 moves the actions, though within the bound
        assert np.abs(out - np.concatenate(want, axis=1)).max() > 0
    kinds = [op.kernel for op in compiled.policy.ops]
    circulant = f"circulant_{precision}"
    assert kinds.count(circulant) == (2 if block_size else 0)


def test_a_compiled_int8_actor_runs_the_codes_of_the_broadcast_as_they_arrived():
    a = arch(None, stochastic=True)
    policy = decode_policy(encode_policy(random_policy(a, seed=5).weights, "int8", version=1))
    engine = make_engine(a, "int8", "compiled")
    engine.load(policy)
    hidden = [policy.weights[f"layers.{i}.weight"] for i in range(3)]
    heads = [policy.weights["mu.weight"], policy.weights["log_std.weight"]]
    for op, sent in zip(engine.policy.ops, [*hidden, None], strict=True):
        codes = np.concatenate([w.codes for w in heads]) if sent is None else sent.codes
        scale = np.concatenate([w.scale for w in heads]) if sent is None else sent.scale
        assert op.kernel == "dense_int8" and np.array_equal(op.codes, codes)
        assert np.array_equal(op.arrays["scale"], scale)


def learner_policy(kind: str):
    """Return a TD3 learner's SB3 model whose 64-wide policy is dense, block-circulant (B = 16) or 16x4-block pruned."""
    config = ActorQConfig(
        **{**TINY, "hidden_sizes": (64, 64, 64), "policy_block_size": 16 if kind == "circulant" else None}
    )
    model = Learner.create(config).model
    if (
        kind == "block_sparse"
    ):  # its hidden-to-hidden layers, 3 of every 4 blocks of 16 rows x 4 inputs masked
        hidden = [m for m in model.policy.actor.mu if isinstance(m, torch.nn.Linear)][1:3]
        for layer in hidden:
            prune_blocks_(layer, "weight", 0.75, (16, 4))
    return model


@pytest.mark.parametrize("comm", ["fp32", "int8"])
@pytest.mark.parametrize(
    "kind, kernel",
    [("dense", "dense_int8"), ("circulant", "circulant_int8"), ("block_sparse", "sparse_int8")],
)
def test_a_compiled_actor_acts_as_compile_policy_of_the_learners_latest_broadcast(kind, kernel, comm):
    if not kernels_available():
        pytest.skip("rlq's compiled policy kernels are not built here")
    model = learner_policy(kind)
    a = architecture_of(model)
    actor = ActorWorker(0, "Pendulum-v1", a, "int8", "compiled", seed=0)
    store, timings = LocalPolicyStore(), dict.fromkeys(ACTOR_TIMERS, 0.0)
    obs = np.random.default_rng(5).standard_normal((16, a.obs_dim)).astype(np.float32)

    def broadcast(version: int) -> np.ndarray:
        """Publish the learner's current weights; return compile_policy's outputs of the weights the actor gets."""
        blob = encode_policy(policy_weights(model), comm, version)
        store.publish(blob, version)
        sent = policy_weights(model) if comm == "fp32" else float_values(decode_policy(blob))
        return compile_policy(acting_sequential(a, sent), "int8").outputs(obs)

    expected = broadcast(0)
    assert actor.pull(store, timings)
    before = actor.engine(obs)[0]
    assert [op.kernel for op in actor.engine.policy.ops[1:3]] == [
        kernel,
        kernel,
    ]  # the hidden-to-hidden layers
    np.testing.assert_array_equal(before, expected)
    with torch.no_grad():  # the learner moves on: every stored parameter (masked blocks stay zero)
        for p in model.policy.actor.parameters():
            p.add_(0.1 * torch.randn_like(p))
    assert not actor.pull(store, timings)  # nothing new yet: the actor keeps its policy
    np.testing.assert_array_equal(actor.engine(obs)[0], before)
    expected = broadcast(1)
    assert actor.pull(store, timings) and actor.version == 1
    after = actor.engine(obs)[0]
    np.testing.assert_array_equal(after, expected)
    assert np.abs(after - before).max() > 1e-3
    np.testing.assert_array_equal(actor.act(obs[0], explore=False), after[0])
    if kind == "block_sparse":
        assert all(op.density == 0.25 for op in actor.engine.policy.ops if op.kernel == kernel)


def test_engine_agreement_plays_the_same_policy_and_episodes_with_both_engines():
    if not kernels_available():
        pytest.skip("rlq's compiled policy kernels are not built here")
    from rlq.actorq import engine_agreement

    config = ActorQConfig(
        **{**TINY, "eval_episodes": 2, "actor_backend": "compiled", "actor_precision": "int8"}
    )
    model = learner_policy("dense")
    with torch.no_grad():  # a policy that moves: the learner's near-zero last layer would act 0 everywhere
        for p in model.policy.actor.parameters():
            p.add_(0.3 * torch.randn_like(p))
    same = engine_agreement(config, model, reference="compiled")
    assert same["returns"] == same["reference_returns"] and same["max_abs_action_difference"] == 0.0
    assert same["observations"] == 2 * 200 and len(same["returns"]) == 2  # Pendulum: 200 steps an episode
    got = engine_agreement(config, model)
    assert (got["engine"], got["reference"]) == ("compiled", "torch")
    # the same comparison made here: PyTorch int8 plays the episodes, both engines act on its observations
    a = architecture_of(model)
    policy = decode_policy(encode_policy(policy_weights(model), "int8", 0))
    engines = {name: make_engine(a, "int8", name) for name in ("torch", "compiled")}
    for engine in engines.values():
        engine.load(policy)
    env = make_env("Pendulum-v1")
    seen, returns = [], []
    for k in range(2):
        obs, _ = env.reset(seed=config.seed + EVAL_SEED_OFFSET + k)
        total, done = 0.0, False
        while not done:
            seen.append(np.asarray(obs, np.float32))
            action = engines["torch"](seen[-1][None])[0][0]
            obs, reward, terminated, truncated, _ = env.step(a.unscale(action))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    actions = {name: np.stack([e(o[None])[0][0] for o in seen]) for name, e in engines.items()}
    assert got["reference_returns"] == pytest.approx(returns, rel=1e-6)
    assert got["max_abs_action_difference"] == pytest.approx(
        np.abs(actions["compiled"] - actions["torch"]).max()
    )
    assert (
        got["max_abs_action_difference"] > 0
    )  # two int8 computations: codes per row, inputs quantized otherwise
    with pytest.raises(ValueError, match="chose auto"):
        engine_agreement(dataclasses.replace(config, actor_backend="auto"), model)


# --- training ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_local_run_with_compiled_int8_actors_trains_its_block_circulant_policy():
    config = ActorQConfig(
        **{**TINY, "policy_block_size": 16, "actor_backend": "compiled", "actor_precision": "int8"}
    )
    initial = policy_weights(Learner.create(config).model)
    result = train(config)
    assert result.learner_steps == 40 and list(result.history["learner_steps"]) == [0, 20, 40]
    assert result.actor_backend == ("compiled-int8" if kernels_available() else "compiled-numpy-int8")
    assert np.isfinite(result.history["eval_return"]).all()
    assert result.breakdown["actor_inference"] > 0 and result.breakdown["actor_load"] > 0
    final = policy_weights(result.model)
    assert final.keys() == initial.keys()
    for name in ("layers.1.weight", "layers.2.weight"):
        assert final[name].shape == initial[name].shape == (2, 2, 16)
        assert not np.allclose(final[name], initial[name])  # the B-vectors trained
    assert not np.allclose(final["layers.0.weight"], initial["layers.0.weight"])
    blob = encode_policy(final, "int8", result.learner_steps)
    assert result.bytes_per_broadcast == len(blob)  # what the breakdown counts is what was sent
    dense_values = sum(v.size for v in decode_policy(blob).float_weights().values())
    sent_values = sum(np.asarray(getattr(v, "codes", v)).size for v in decode_policy(blob).weights.values())
    assert sent_values < dense_values - 2 * 32 * 32 * (1 - 1 / 16) + 1


@pytest.mark.slow
def test_a_block_circulant_learner_resumes_from_its_checkpoint(tmp_path):
    config = ActorQConfig(
        **{**TINY, "policy_block_size": 16, "actor_backend": "compiled", "checkpoint_dir": str(tmp_path),
           "checkpoint_every": 20}
    )  # fmt: skip

    def interrupt(progress):
        if progress.learner_steps >= 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config, callback=interrupt)
    resumed = train(config)
    assert resumed.resumed_from == 20 and resumed.learner_steps == 40
    assert architecture_of(resumed.model).block_size == 16
    assert policy_weights(resumed.model)["layers.1.weight"].shape == (2, 2, 16)
    with pytest.raises(ActorQConfigError, match="policy_block_size: 16 there, 8 here"):
        train(dataclasses.replace(config, policy_block_size=8))
