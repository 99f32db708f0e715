"""combo_sparse_quant: bits of every deployed method against an independent count, the Pareto helper, GST and QAT resumed."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import interrupt_at
from rlq.analysis.pareto import best_within_dense, method_summary, pareto_front
from rlq.compress import is_block_circulant
from rlq.compress.block_circulant import stored_target
from rlq.compress.masks import mask_of, stored_tensor
from rlq.rl.agents import make_model
from rlq.rl.zoo import zoo_td3_settings
from rlq.sb3.action_path import action_network
from rlq.sb3.checkpoint import CompressedCheckpoints
from rlq.sb3.deployed import (
    METHODS,
    deploy_actor,
    deploy_and_measure,
    deployed_latency,
    deployment,
    latency_columns,
)
from rlq.sb3.gst_callback import GSTCallback
from rlq.sb3.pruning_callback import GradualPruningCallback
from rlq.sb3.qat_callback import QATCallback

HYPER = {
    "policy_kwargs": {"net_arch": [16, 16]},
    "learning_starts": 40,
    "buffer_size": 1000,
    "batch_size": 16,
}
#: rewards never count as a drop: GST's target rises at every update (deterministic)
ALWAYS_HOLDS = {"window": 1, "step_size": 0.1, "max_sparsity": 0.9, "abs_tolerance": 1e9}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one PyTorch thread per test


class ScriptedGST(GSTCallback):
    def _scores(self) -> list[float]:
        return [1.0]


def gst() -> GSTCallback:
    """GST over 240 steps that stays block-circulant (B = 4) and prunes its B-vectors from 25% of training."""
    return ScriptedGST(total_steps=240, block_schedule=((0.0, 4),), bc_end=1.0, s_shift=0.25, prune_every=10,
                       sparsity=ALWAYS_HOLDS)  # fmt: skip


def pruning() -> GradualPruningCallback:
    return GradualPruningCallback(final_sparsity=0.75, start_fraction=0.1, end_fraction=0.6, update_every=10)


def trained(*callbacks):
    model = make_model("TD3", "Pendulum-v1", seed=0, hyperparams=HYPER)
    if callbacks:
        model.learn(240, callback=list(callbacks))
    return model


@pytest.fixture(scope="module")
def agents() -> dict:
    """The agent each method is derived from, trained as combo_sparse_quant trains it."""
    torch.set_num_threads(1)
    dense, pruned, block = trained(), trained(pruning()), trained(gst())
    return {
        "dense": dense,
        "ptq_int8": dense,
        "pruning_ptq_int8": pruned,
        "gst": block,
        "gst_ptq_int8": block,
        "gst_qat": trained(gst(), QATCallback(4)),
        "pruning_qat": trained(pruning(), QATCallback(4)),
    }


def index_bits_by_hand(mask: torch.Tensor) -> int:
    """The cheaper of a bitmask and relative indices: at each width, walk the gaps, one filler code per 2^w - 1 skipped."""
    flat = mask.detach().reshape(-1).numpy().astype(bool)
    kept = np.flatnonzero(flat)
    if not len(kept):
        return 0
    gaps = np.diff(np.concatenate([[-1], kept]))
    best = flat.size
    for width in range(1, 33):
        entries = 0
        for gap in gaps.tolist():
            while gap > 2**width - 1:
                gap -= 2**width - 1
                entries += 1
            entries += 1
        best = min(best, width * entries)
        if 2**width - 1 >= gaps.max():
            break
    return best


def count_by_hand(model, bits: int | None, per_channel: bool | None) -> float:
    """Stored bits of the actor's weights over its dense count: values, index, 32-bit scales (no bits.py code)."""
    network, _ = action_network(model)
    total = dense = 0
    for layer in (m for m in network.modules() if isinstance(m, torch.nn.Linear)):
        out_features, in_features = layer.weight.shape
        dense += out_features * in_features
        target, name = stored_target(layer)
        stored, mask = stored_tensor(target, name), mask_of(target, name)
        kept = stored.numel() if mask is None else int(mask.sum())
        total += kept * (32 if bits is None else bits)
        total += 0 if mask is None else index_bits_by_hand(mask)
        if bits is not None:  # one scale per tensor, or per output channel (per block row when circulant)
            block = stored.shape[2] if is_block_circulant(layer) else 1
            total += 32 * (out_features // block if per_channel else 1)
    return total / dense


@pytest.mark.parametrize("method", METHODS)
def test_bits_per_weight_of_each_method_match_an_independent_count(agents, method, tmp_path):
    model = agents[method]
    bits, per_channel, _ = deployment(method, 4)
    actor = deploy_actor(model, method, tmp_path, qat_bits=4)
    assert actor.bits_per_weight == pytest.approx(count_by_hand(model, bits, per_channel), rel=1e-12)
    if method == "dense":
        assert actor.bits_per_weight == 32.0
    # the shipped file holds what is counted (plus a header and float32 biases)
    network, _ = action_network(model)
    dense = sum(m.weight.numel() for m in network.modules() if isinstance(m, torch.nn.Linear))
    assert actor.packed_bytes >= actor.bits_per_weight * dense / 8
    # the deployed actor acts like the model (int8 is re-quantized by ONNX Runtime: looser)
    obs = np.stack([model.observation_space.sample() for _ in range(16)])
    tolerance = 0.1 if method.endswith("int8") else 1e-4
    np.testing.assert_allclose(
        actor.policy.predict(obs)[0], model.predict(obs, deterministic=True)[0], atol=tolerance * 2
    )  # fmt: skip  (Pendulum's actions span [-2, 2])


def test_compressed_methods_store_fewer_bits(agents, tmp_path):
    bits = {m: deploy_actor(agents[m], m, tmp_path, qat_bits=4).bits_per_weight for m in METHODS}
    assert bits["dense"] == 32.0 and 8 < bits["ptq_int8"] < 9  # 8 plus one 32-bit scale per layer
    assert bits["gst_ptq_int8"] < bits["gst"] < 32  # the same GST agent, stored at 8 instead of 32 bits
    assert bits["pruning_ptq_int8"] < bits["ptq_int8"]
    # 4-bit values, but one 32-bit scale per output channel: on 16-wide layers the scales cost ~2 bits a weight
    assert bits["gst_qat"] < 8 and bits["pruning_qat"] < 8


def test_pareto_front_on_a_hand_made_table():
    table = pd.DataFrame(
        {
            "method": ["a", "b", "c", "d", "e", "f", "g", "h"],
            "bits_per_weight": [32.0, 8.0, 4.0, 4.0, 1.0, 2.0, float("nan"), 4.0],
            "return_iqm": [100.0, 100.0, 90.0, 80.0, 50.0, 40.0, 500.0, 90.0],
        }
    )
    front = pareto_front(table, "bits_per_weight")
    # a: b stores fewer bits at the same return; d: c is better; f: e has fewer bits and more return;
    # g has no cost (NaN) and is never on the front; c and h tie and neither dominates the other
    assert dict(zip(table["method"], front, strict=True)) == {
        "a": False, "b": True, "c": True, "d": False, "e": True, "f": False, "g": False, "h": True,
    }  # fmt: skip


def test_summary_and_best_method_within_dense_interval():
    """Pendulum-v1 is solved at -200 (rlq's stated threshold); Humanoid-v5 has none, so solved is NaN."""
    rows = pd.DataFrame(
        [
            dict(env_id=env, seed=s, method=m, eval_return=r + s, bits_per_weight=b, packed_bytes=1.0,
                 latency_us=10.0, latency_ratio=1.0)
            for env in ("Pendulum-v1", "Humanoid-v5")
            for s in range(3)
            for m, r, b in [("dense", -150, 32.0), ("gst_qat", -150, 1.2), ("pruning_qat", -230, 0.9),
                            ("gst", -149, 9.0), ("pruning_ptq_int8", -201, 2.0)]
        ]
    )  # fmt: skip
    summary = method_summary(rows, reps=200)
    pendulum = summary[summary["env_id"] == "Pendulum-v1"]
    assert list(pendulum["method"]) == [
        "dense",
        "pruning_ptq_int8",
        "gst",
        "gst_qat",
        "pruning_qat",
    ]  # METHODS order
    within = dict(zip(pendulum["method"], pendulum["within_dense_interval"], strict=True))
    assert within == {
        "dense": True,
        "pruning_ptq_int8": False,
        "gst": True,
        "gst_qat": True,
        "pruning_qat": False,
    }
    # returns -201, -200, -199: two of three seeds reach -200
    solved = dict(zip(pendulum["method"], pendulum["solved"], strict=True))
    assert solved == {"dense": 3, "pruning_ptq_int8": 2, "gst": 3, "gst_qat": 3, "pruning_qat": 0}
    assert summary.loc[summary["env_id"] == "Humanoid-v5", "solved"].isna().all()
    best = best_within_dense(summary, "Pendulum-v1")
    assert best["method"] == "gst_qat" and best["compression_factor"] == pytest.approx(32 / 1.2)


def test_zoo_settings_are_read_from_the_installed_rl_zoo3():
    """Pendulum-v1's TD3 entry of rl_zoo3's td3.yml, read from the file itself, as a combo job takes it."""
    import yaml

    from rlq.rl.zoo import ZooSettingError, zoo_file

    raw = yaml.safe_load(zoo_file("TD3").read_text())["Pendulum-v1"]
    steps, hyperparams = zoo_td3_settings("Pendulum-v1")
    assert steps == int(raw["n_timesteps"])
    assert hyperparams["action_noise_std"] == raw["noise_std"] and raw["noise_type"] == "normal"
    assert (hyperparams["gamma"], hyperparams["learning_rate"]) == (raw["gamma"], raw["learning_rate"])
    assert hyperparams["learning_starts"] == raw["learning_starts"]
    assert hyperparams["buffer_size"] == min(raw["buffer_size"], steps)
    assert hyperparams["policy_kwargs"] == {"net_arch": [400, 300]}
    json.dumps(hyperparams)  # a run folder records them as JSON
    with pytest.raises(ZooSettingError, match="ornstein-uhlenbeck|OrnsteinUhlenbeck"):
        zoo_td3_settings("MountainCarContinuous-v0")  # the zoo explores with OU noise there
    with pytest.raises(ZooSettingError):
        zoo_td3_settings("Humanoid-v5")  # no TD3 entry in the zoo


def test_latency_measured_after_training_from_the_deployed_files(agents, tmp_path):
    """Deployment leaves the ONNX files and an observation; deployed_latency times them later, beside the reference."""
    folder = tmp_path / "deployed"
    rows = deploy_and_measure(agents["dense"], "Pendulum-v1", ["ptq_int8", "dense"], seed=0, folder=folder,
                              eval_episodes=1)  # fmt: skip
    assert [r["method"] for r in rows] == ["dense", "ptq_int8"]  # METHODS order
    assert all(math.isfinite(r["eval_return"]) and r["bits_per_weight"] > 0 for r in rows)
    untimed = latency_columns({}, "dense")
    assert set(untimed) == {"latency_us", "latency_p90_us", "reference_latency_us", "latency_ratio"}
    assert all(math.isnan(v) for v in untimed.values())
    timings = deployed_latency(folder, ["dense", "ptq_int8"], repeats=5, rounds=2)
    for method in ("dense", "ptq_int8"):
        columns = latency_columns(timings, method)
        assert columns["latency_us"] > 0 and columns["reference_latency_us"] > 0
        assert columns["latency_ratio"] == pytest.approx(
            columns["latency_us"] / columns["reference_latency_us"]
        )
    with pytest.raises(FileNotFoundError, match="gst.onnx"):
        deployed_latency(folder, ["gst"], repeats=5, rounds=1)


def test_gst_and_qat_in_one_learn_resume_from_their_checkpoint(tmp_path):
    """GST and QAT in one learn, killed at step 200; trained again into the same folder, it goes on from step 160."""
    settings = dict(block_schedule=[(0.0, 4)], bc_end=0.5, s_shift=0.5, prune_every=10, sparsity=ALWAYS_HOLDS)

    def train(folder, *extra):
        callbacks = [GSTCallback(**settings), QATCallback(4, delay_steps=120)]
        checkpoints = CompressedCheckpoints(folder, every=80)
        model = checkpoints.resume(make_model("TD3", "Pendulum-v1", seed=0, hyperparams=HYPER), callbacks)
        model.learn(
            240 - model.num_timesteps, callback=[*callbacks, checkpoints, *extra], reset_num_timesteps=False
        )
        return model, callbacks, checkpoints

    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "run", interrupt_at(200))
    model, (gst_callback, qat), checkpoints = train(tmp_path / "run")
    assert checkpoints.resumed_from == 160 and model.num_timesteps == 240
    assert any(h["enabled"] for h in qat.history) and gst_callback.history["compression_ratio"].iloc[-1] > 0
    (row,) = deploy_and_measure(model, "Pendulum-v1", ["gst_qat"], seed=0, folder=tmp_path / "deployed",
                                eval_episodes=1)  # fmt: skip
    assert row["bits_per_weight"] < 8 and math.isfinite(row["eval_return"])
