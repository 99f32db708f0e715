"""Block pruning: whole R x K blocks by L2 norm, in magnitude_prune_, GST and gradual pruning, and what it stores."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch.nn.utils import prune

from conftest import relu_mlp as mlp
from rlq.compress import (
    GradualPruning,
    GradualPruningConfig,
    GSTConfig,
    GSTSchedule,
    RewardAwareConfig,
    block_circulant_,
    is_block_circulant,
    magnitude_prune_,
    weight_bytes_per_update,
)
from rlq.compress.block_circulant import stored_target
from rlq.compress.masks import mask_of, stored_tensor
from rlq.compress.measures import block_storage, stored_weight_count
from rlq.compress.pruning import DEPLOY_BLOCK

pytestmark = pytest.mark.usefixtures("one_thread")


def numpy_block_norms(values: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """The L2 norm of every R x K block of ``values`` viewed as 2-D, edge blocks zero-padded (by loops)."""
    flat = values.reshape(values.shape[0], -1).astype(np.float64)
    rows, cols = block
    n_r, n_c = -(-flat.shape[0] // rows), -(-flat.shape[1] // cols)
    norms = np.zeros((n_r, n_c))
    for i in range(n_r):
        for j in range(n_c):
            tile = flat[i * rows : (i + 1) * rows, j * cols : (j + 1) * cols]
            norms[i, j] = np.sqrt(np.sum(tile * tile))
    return norms


def numpy_block_mask(norms_by_layer: list[np.ndarray], amount: float) -> list[np.ndarray]:
    """Keep-maps: the round(amount * blocks) smallest norms over all layers together are 0."""
    flat = np.concatenate([n.ravel() for n in norms_by_layer])
    order = np.argsort(flat, kind="stable")
    keep = np.ones_like(flat)
    keep[order[: round(amount * flat.size)]] = 0
    return [k.reshape(n.shape) for k, n in zip(np.split(keep, np.cumsum([n.size for n in norms_by_layer])[:-1]),
                                              norms_by_layer, strict=True)]  # fmt: skip


def entry_mask(keep: np.ndarray, block: tuple[int, int], shape: tuple[int, ...]) -> np.ndarray:
    full = np.kron(keep, np.ones(block))
    rows = shape[0]
    cols = int(np.prod(shape[1:]))
    return full[:rows, :cols].reshape(shape)


def assert_whole_blocks(mask: torch.Tensor, values: torch.Tensor, block: tuple[int, int]) -> None:
    """Every R x K block of the mask is all 0 or all 1, and the values are 0 wherever it is 0."""
    m = mask.detach().reshape(mask.shape[0], -1).numpy()
    rows, cols = block
    for i in range(0, m.shape[0], rows):
        for j in range(0, m.shape[1], cols):
            tile = m[i : i + rows, j : j + cols]
            assert tile.min() == tile.max(), f"block ({i}, {j}) is partly pruned"
    assert (values.detach()[mask == 0] == 0).all()


@pytest.mark.parametrize("block", [(16, 4), (5, 3), (1, 4)])
def test_layer_scope_masks_the_blocks_of_smallest_l2_norm(block):
    torch.manual_seed(0)
    net = mlp((6, 32, 20, 3))
    hidden = net[2]  # 20 x 32: (5, 3) leaves edge blocks
    before = hidden.weight.detach().numpy().copy()
    magnitude_prune_(net, 0.6, block=block)
    expected = entry_mask(numpy_block_mask([numpy_block_norms(before, block)], 0.6)[0], block, before.shape)
    np.testing.assert_array_equal(mask_of(hidden, "weight").numpy(), expected)
    np.testing.assert_array_equal(hidden.weight.detach().numpy(), before * expected)
    assert mask_of(net[0], "weight") is None and mask_of(net[4], "weight") is None  # first, last: dense


def test_global_scope_ranks_every_layers_blocks_together():
    torch.manual_seed(1)
    net = mlp((6, 32, 32, 16, 3))
    layers = [net[2], net[4]]
    norms = [numpy_block_norms(layer.weight.detach().numpy(), DEPLOY_BLOCK) for layer in layers]
    keeps = numpy_block_mask(norms, 0.5)
    magnitude_prune_(net, 0.5, scope="global", block=DEPLOY_BLOCK)
    for layer, keep in zip(layers, keeps, strict=True):
        np.testing.assert_array_equal(
            mask_of(layer, "weight").numpy(), entry_mask(keep, DEPLOY_BLOCK, layer.weight.shape)
        )
    assert sum(k.size - k.sum() for k in keeps) == round(0.5 * sum(k.size for k in keeps))


def test_raising_keeps_pruned_blocks_and_lowering_regrows_the_largest():
    torch.manual_seed(2)
    net = mlp((6, 32, 32, 3))
    hidden = net[2]
    magnitude_prune_(net, 0.5, block=(16, 4))
    first = mask_of(hidden, "weight").clone()
    magnitude_prune_(net, 0.75, block=(16, 4))
    second = mask_of(hidden, "weight")
    assert ((second == 1) <= (first == 1)).all()  # nothing pruned at 0.5 came back
    assert_whole_blocks(second, hidden.weight, (16, 4))
    magnitude_prune_(net, 0.25, block=(16, 4))
    assert float(mask_of(hidden, "weight").mean()) == pytest.approx(0.75)


def test_block_circulant_layers_lose_whole_b_vectors():
    torch.manual_seed(3)
    net = mlp((6, 32, 32, 3))
    block_circulant_(net, 4)
    layer = net[2]
    target, name = stored_target(layer)
    vectors = stored_tensor(target, name).detach().numpy().copy()  # (8, 8, 4)
    magnitude_prune_(net, 0.5, block=DEPLOY_BLOCK)
    norms = np.linalg.norm(vectors, axis=2)
    keep = numpy_block_mask([norms], 0.5)[0]
    mask = mask_of(target, name).numpy()
    np.testing.assert_array_equal(mask, np.repeat(keep[:, :, None], 4, axis=2))
    assert is_block_circulant(layer)
    # each pruned vector is one 4 x 4 block of zeros of the expanded weight
    dense = layer.weight.detach().numpy()
    assert_whole_blocks(torch.from_numpy(np.kron(keep, np.ones((4, 4)))), torch.from_numpy(dense), (4, 4))


def test_block_storage_counts_kept_blocks_and_their_indices():
    torch.manual_seed(4)
    net = mlp((6, 64, 32, 3))
    hidden = net[2]  # 32 x 64: 2 block rows x 16 block columns of 16 x 4
    magnitude_prune_(net, 0.75, block=DEPLOY_BLOCK)
    stored = block_storage(hidden, DEPLOY_BLOCK)
    assert stored == {"blocks": 8, "block_rows": 2, "values": 8 * 64, "indices": 8 + 2 + 1}
    assert stored_weight_count(hidden) == 8 * 64
    measured = weight_bytes_per_update(net, value_bytes=1, index_bytes=4, block=DEPLOY_BLOCK)
    first_last = 64 * 6 + 3 * 32  # dense int8 values
    assert measured["compressed_bytes"] == first_last + 8 * 64 + 4 * (8 + 2 + 1)
    assert measured["dense_bytes"] == first_last + 32 * 64
    # without the block shape the same mask is counted as CSR over single entries, here more than dense
    csr = 8 * 64 * (1 + 4) + 4 * (32 + 1)
    assert csr > 32 * 64
    assert weight_bytes_per_update(net, 1, 4)["compressed_bytes"] == first_last + 32 * 64


def test_block_storage_of_pruned_b_vectors_counts_one_index_per_vector():
    torch.manual_seed(5)
    net = mlp((6, 32, 32, 3))
    block_circulant_(net, 4)
    magnitude_prune_(net, 0.5, block=DEPLOY_BLOCK)
    assert block_storage(net[2], DEPLOY_BLOCK) == {
        "blocks": 32,
        "block_rows": 8,
        "values": 128,
        "indices": 41,
    }


def test_gst_schedule_prunes_blocks_through_the_hand_over():
    torch.manual_seed(6)
    net = mlp((6, 32, 32, 32, 3))
    config = GSTConfig(
        total_steps=100, bc_end=0.5, s_shift=0.5, prune_every=10, prune_block=DEPLOY_BLOCK,
        sparsity=RewardAwareConfig(window=1, step_size=0.05, max_sparsity=0.9, abs_tolerance=1e9),
    )  # fmt: skip
    schedule = GSTSchedule(config)
    for step in range(100):
        schedule.apply_(net, step, [1.0])
        for layer in (net[2], net[4]):
            mask = mask_of(*stored_target(layer))
            if mask is None:
                continue
            if is_block_circulant(layer):  # whole B-vectors
                flat = mask.reshape(-1, 4)
                assert (flat.min(dim=1).values == flat.max(dim=1).values).all(), step
            else:
                assert_whole_blocks(mask, layer.weight, DEPLOY_BLOCK)
    assert schedule.handed_over and not is_block_circulant(net[2])
    assert 0.75 < float(1 - mask_of(net[2], "weight").mean()) <= 0.9


def test_gradual_pruning_prunes_blocks():
    torch.manual_seed(7)
    net = mlp((6, 32, 32, 3))
    schedule = GradualPruning(GradualPruningConfig(total_steps=50, final_sparsity=0.5, prune_block=(16, 4)))
    for step in range(50):
        schedule.apply_(net, step)
    assert float(mask_of(net[2], "weight").mean()) == pytest.approx(0.5)
    assert_whole_blocks(mask_of(net[2], "weight"), net[2].weight, (16, 4))


def test_without_a_block_shape_pruning_is_prunes_own_l1_mask():
    torch.manual_seed(8)
    net = mlp((6, 32, 32, 3))
    reference = copy.deepcopy(net[2])
    magnitude_prune_(net, 0.6, block=None)
    prune.l1_unstructured(reference, "weight", amount=0.6)
    assert torch.equal(mask_of(net[2], "weight"), reference.weight_mask)


def test_bad_block_shapes_are_rejected():
    net = mlp()
    for bad in [(0, 4), (16,), (16, 4.0), "16x4", (True, 4)]:
        with pytest.raises(ValueError, match="two positive ints"):
            magnitude_prune_(net, 0.5, block=bad)
        with pytest.raises(ValueError, match="prune_block"):
            GSTConfig(total_steps=10, prune_block=bad)
