"""GST and gradual pruning with ``prune_block`` inside SB3 training: whole blocks zero, online and target alike."""

from __future__ import annotations

import pytest
import torch

from rlq.compress import is_block_circulant
from rlq.compress.block_circulant import stored_target
from rlq.compress.masks import mask_of
from rlq.compress.pruning import DEPLOY_BLOCK
from rlq.deploy import compile_policy
from rlq.rl.agents import make_model
from rlq.sb3.gst_callback import GSTCallback
from rlq.sb3.pruning_callback import GradualPruningCallback

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one PyTorch thread per test

#: TD3 on Pendulum with a 32 x 32 hidden layer in the actor and each critic: 2 x 8 blocks of 16 x 4
TINY_TD3 = {
    "policy_kwargs": {"net_arch": [32, 32]},
    "learning_starts": 40,
    "buffer_size": 1000,
    "batch_size": 16,
}
#: rewards never count as a drop: the reward-aware target rises at every update
ALWAYS_HOLDS = {"window": 1, "step_size": 0.1, "max_sparsity": 0.9, "abs_tolerance": 1e9}


def assert_whole_blocks_zero(layer: torch.nn.Module, block: tuple[int, int]) -> float:
    """Assert the layer's mask prunes whole blocks and its weight is 0 there; return the pruned fraction."""
    mask = mask_of(*stored_target(layer))
    assert mask is not None
    rows, cols = block
    tiles = mask.reshape(mask.shape[0] // rows, rows, mask.shape[1] // cols, cols)
    assert torch.equal(tiles.amin(dim=(1, 3)), tiles.amax(dim=(1, 3))), "a block is partly pruned"
    weight = layer.weight.detach()
    assert (weight[mask == 0] == 0).all()
    return 1.0 - float(mask.mean())


def eligible_pairs(callback):
    layers = callback.layers
    return [(layers.online[name], layers.targets.get(name)) for name in layers.eligible]


def test_gst_with_prune_block_leaves_whole_zero_blocks_after_training_td3():
    model = make_model("TD3", "Pendulum-v1", seed=0, hyperparams=TINY_TD3)
    callback = GSTCallback(
        total_steps=240, block_schedule=((0.0, 4),), bc_end=0.5, s_shift=0.5, prune_every=20,
        sparsity=ALWAYS_HOLDS, prune_block=DEPLOY_BLOCK,
    )  # fmt: skip
    model.learn(240, callback=callback)
    kinds = set(callback.events["kind"])
    assert {"block_circulant", "prune", "hand_over"} <= kinds
    pairs = eligible_pairs(callback)
    assert len(pairs) == 3  # actor and both critics
    for online, target in pairs:
        assert not is_block_circulant(online)
        assert assert_whole_blocks_zero(online, DEPLOY_BLOCK) >= 0.75  # 12 of 16 blocks or more
        assert target is not None and torch.equal(
            mask_of(*stored_target(target)), mask_of(*stored_target(online))
        )
        assert_whole_blocks_zero(target, DEPLOY_BLOCK)
    # the final actor compiles block-sparse in the shape it was pruned in
    ops = compile_policy(model, "int8").describe()
    assert any(op["kernel"].startswith("sparse_int8 16x4") for op in ops), ops


def test_gradual_pruning_with_prune_block_leaves_whole_zero_blocks_after_training_td3():
    model = make_model("TD3", "Pendulum-v1", seed=0, hyperparams=TINY_TD3)
    callback = GradualPruningCallback(
        0.75, start_fraction=0.2, end_fraction=0.6, update_every=20, prune_block=(16, 4)
    )
    model.learn(200, callback=callback)
    for online, target in eligible_pairs(callback):
        assert assert_whole_blocks_zero(online, (16, 4)) == pytest.approx(0.75)
        assert_whole_blocks_zero(target, (16, 4))
    assert callback.compression_ratio() == pytest.approx(0.75 * callback.covered_fraction)
