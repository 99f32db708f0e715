"""How compressed a module is: stored versus dense weights, per layer, over training, and in bytes.

Counting rule (GST, arXiv 2101.09650): over every ``nn.Linear`` and convolution weight of the module
(biases excluded), a dense layer stores all its weights, a block-circulant layer ``out * in / B`` (its
B-vectors), a pruned layer the entries its mask keeps, and a pruned block-circulant layer the B-vector
entries its mask keeps. Zeros that no mask enforces are not counted as compressed.

A layer pruned in whole blocks (``magnitude_prune_(..., block=(R, K))``) stores its kept blocks and one
index per kept block: :func:`block_storage` counts both, and :func:`weight_bytes_per_update` with ``block``
counts the bytes of that block-CSR form.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import torch
from torch import nn

from rlq.compress.block_circulant import block_size_of, circulant_vectors, is_block_circulant, stored_target
from rlq.compress.layers import dense_weight_numel, weight_layers
from rlq.compress.masks import block_norms, mask_of, stored_tensor
from rlq.compress.pruning import check_block_shape, pruning_block_of
from rlq.core.validation import check_positive_int


def stored_weight_count(layer: nn.Module) -> int:
    """Return how many weight values ``layer`` stores under the counting rule of this module."""
    mask = mask_of(*stored_target(layer)) if hasattr(layer, "weight") else None
    if mask is not None:
        return int(mask.count_nonzero())
    if is_block_circulant(layer):
        return circulant_vectors(layer).numel()
    return dense_weight_numel(layer)


def block_storage(layer: nn.Module, block: tuple[int, int]) -> dict[str, int]:
    """Return what ``layer`` stores when pruned in ``block``-shaped blocks, as block-CSR over its stored values.

    ``block`` is the dense weight's ``(R, K)``; a block-circulant layer's blocks are whole B-vectors
    (:func:`rlq.compress.pruning.pruning_block_of`). Keys: ``blocks`` (kept, i.e. holding an entry the
    mask keeps; every block of an unmasked layer), ``block_rows``, ``values`` (``blocks * R * K``, edge
    blocks padded as they are stored) and ``indices`` (one column index per kept block plus
    ``block_rows + 1`` row pointers).
    """
    target, name = stored_target(layer)
    mask = mask_of(target, name)
    present = torch.ones_like(stored_tensor(target, name)) if mask is None else mask
    rows, cols = shape = pruning_block_of(layer, check_block_shape(block, "block"))
    kept = block_norms(present, shape) > 0
    blocks = int(kept.sum())
    return {
        "blocks": blocks,
        "block_rows": int(kept.shape[0]),
        "values": blocks * rows * cols,
        "indices": blocks + int(kept.shape[0]) + 1,
    }


def layer_kind(layer: nn.Module) -> str:
    """Return ``"dense"``, ``"block_circulant"``, ``"pruned"`` or ``"block_circulant+pruned"``."""
    circulant = is_block_circulant(layer)
    pruned = mask_of(*stored_target(layer)) is not None
    if circulant and pruned:
        return "block_circulant+pruned"
    return "block_circulant" if circulant else "pruned" if pruned else "dense"


def layer_report(module: nn.Module) -> list[dict[str, Any]]:
    """Return one row per Linear/convolution: name, shape, kind, block_size, stored, dense, ratio.

    ``ratio`` is the layer's compression ratio ``1 - stored / dense``. ``pandas.DataFrame(rows)`` makes a
    table of it.
    """
    rows = []
    for name, layer in weight_layers(module):
        dense = dense_weight_numel(layer)
        stored = stored_weight_count(layer)
        rows.append(
            {
                "name": name,
                "shape": _weight_shape(layer),
                "kind": layer_kind(layer),
                "block_size": block_size_of(layer),
                "stored": stored,
                "dense": dense,
                "ratio": 1.0 - stored / dense,
            }
        )
    return rows


def _weight_shape(layer: nn.Module) -> tuple[int, ...]:
    if isinstance(layer, nn.Linear):
        return (layer.out_features, layer.in_features)
    if layer.transposed:
        return (layer.in_channels, layer.out_channels // layer.groups, *layer.kernel_size)
    return (layer.out_channels, layer.in_channels // layer.groups, *layer.kernel_size)


def compression_ratio(module: nn.Module) -> float:
    """Return ``1 - stored weights / dense weights`` over all Linear and convolution weights of ``module``."""
    rows = layer_report(module)
    if not rows:
        raise ValueError("the module has no nn.Linear or convolution layer to measure")
    return 1.0 - sum(r["stored"] for r in rows) / sum(r["dense"] for r in rows)


def covered_fraction(module: nn.Module) -> float:
    """Return the fraction of the module's Linear/Conv weights held by compressed layers (GST: 94-99%)."""
    rows = layer_report(module)
    if not rows:
        raise ValueError("the module has no nn.Linear or convolution layer to measure")
    return sum(r["dense"] for r in rows if r["kind"] != "dense") / sum(r["dense"] for r in rows)


def average_compression_ratio(
    history: Sequence[float], steps: Sequence[int] | None = None, total_steps: int | None = None
) -> float:
    """Return the mean compression ratio over training updates (GST's "average compression ratio").

    With ``history`` alone, each entry is one training update and the result is their mean. When the ratio
    was recorded only at some updates, give those update indices as ``steps`` (increasing) and the number of
    updates ``total_steps``: each ratio then holds from its step until the next, and the mean runs over
    ``[steps[0], total_steps)``.
    """
    values = [float(v) for v in history]
    if not values:
        raise ValueError("history is empty: record the compression ratio at least once")
    bad = [v for v in values if not (math.isfinite(v) and 0.0 <= v <= 1.0)]
    if bad:
        raise ValueError(f"compression ratios must lie in [0, 1], got {bad[:3]}")
    if steps is None:
        if total_steps is not None:
            raise ValueError("total_steps needs steps")
        return sum(values) / len(values)
    steps = [int(s) for s in steps]
    if len(steps) != len(values):
        raise ValueError(f"steps has {len(steps)} entries, history {len(values)}")
    if any(b <= a for a, b in pairwise(steps)):
        raise ValueError("steps must be strictly increasing")
    if total_steps is None or total_steps <= steps[-1]:
        raise ValueError(f"total_steps must exceed the last recorded step {steps[-1]}, got {total_steps}")
    durations = [b - a for a, b in pairwise([*steps, total_steps])]
    return sum(v * d for v, d in zip(values, durations, strict=True)) / (total_steps - steps[0])


def weight_bytes_per_update(
    module: nn.Module,
    value_bytes: int = 4,
    index_bytes: int = 4,
    passes: int = 1,
    block: tuple[int, int] | None = None,
) -> dict[str, float]:
    """Return bytes of weights read per training update: ``dense_bytes``, ``compressed_bytes``, ``reduction``.

    Dense: every weight as a ``value_bytes`` number (fp32: 4). Compressed: a block-circulant layer reads its
    B-vectors; a pruned layer reads its kept values in CSR form (value + ``index_bytes`` column index per
    kept entry, plus one ``index_bytes`` row pointer per row and one more), over the weight viewed as
    ``out x (in * prod(kernel))`` or, for pruned B-vectors, the vectors viewed as
    ``(out/B * in/B) x (B * prod(kernel))``; when dense storage of those values is smaller than CSR (low
    sparsity), the dense form is counted. With ``block``, the layers pruned in blocks of that shape are
    counted as block-CSR instead (:func:`block_storage`: kept blocks' values plus one index per kept block
    and per block row, and one more). ``passes`` multiplies both (e.g. 2 for forward and backward).
    ``reduction`` is ``1 - compressed / dense``. Biases are not counted.
    """
    for label, value in (("value_bytes", value_bytes), ("index_bytes", index_bytes), ("passes", passes)):
        check_positive_int(label, value)
    dense_bytes = compressed_bytes = 0
    for _, layer in weight_layers(module):
        numel = dense_weight_numel(layer)
        dense_bytes += numel * value_bytes
        target, name = stored_target(layer)
        mask = mask_of(target, name)
        if is_block_circulant(layer):
            shape = circulant_vectors(layer).shape
            rows, stored_numel = shape[0] * shape[1], math.prod(shape)
        else:
            rows, stored_numel = _weight_shape(layer)[0], numel
        if mask is None:
            compressed_bytes += stored_numel * value_bytes
        elif block is not None:
            stored = block_storage(layer, block)
            blocked = stored["values"] * value_bytes + stored["indices"] * index_bytes
            compressed_bytes += min(blocked, stored_numel * value_bytes)
        else:
            csr = int(mask.count_nonzero()) * (value_bytes + index_bytes) + (rows + 1) * index_bytes
            compressed_bytes += min(csr, stored_numel * value_bytes)
    dense_bytes *= passes
    compressed_bytes *= passes
    return {
        "dense_bytes": float(dense_bytes),
        "compressed_bytes": float(compressed_bytes),
        "reduction": 1.0 - compressed_bytes / dense_bytes if dense_bytes else 0.0,
    }
