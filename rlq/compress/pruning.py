"""Magnitude pruning built on ``torch.nn.utils.prune``, and Zhu & Gupta's gradual sparsity schedule.

Masks are ``prune``'s own (``weight_orig`` * ``weight_mask``), so pruned weights stay exactly zero while an
optimizer trains the layer. A block-circulant layer is pruned on its stored B-vector entries (mask on the
parametrization's ``original``): it stays block-circulant and stores only the unmasked entries, so a layer
with B=4 and vector sparsity s has compression ratio ``1 - (1 - s) / 4``.

``magnitude_prune_(module, s)`` sets the sparsity of the stored values to exactly ``s`` every time it is
called (it is not incremental like ``prune``'s ``amount`` on an already pruned tensor): the current mask is
baked in (masked values become 0) and a fresh L1 mask is computed, so raising ``s`` keeps every earlier
zero pruned, and lowering it regrows the largest-magnitude pruned entries starting from 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

from rlq.compress.block_circulant import block_size_of, stored_target
from rlq.compress.layers import (
    CompressionReport,
    Networks,
    classify_layers,
    compressible_layers,
    covered_fraction_of,
)
from rlq.compress.masks import (
    bake_mask_,
    mask_of,
    prune_global_blocks_,
    prune_global_l1_,
    prune_l1_,
    stored_tensor,
)
from rlq.core.validation import check_fraction, check_positive_int

SCOPES = ("layer", "global")
DEPLOY_BLOCK = (16, 4)
"""The block shape ``(rows, inputs)`` to prune in for ``rlq.deploy``'s block-sparse int8 kernel.

That kernel (``sparse_i8`` in ``rlq/deploy/_policy_kernels.c``) walks the weight one block row of ``R``
output rows at a time: it gathers the input slices of the row's kept blocks into one contiguous buffer,
then runs the dense u8 x s8 dot of each of the ``R`` rows over it, four rows sharing every load. The
gather, the column index (one int32 per kept block) and the row pointer are paid once per block, so a
taller block spreads them over more rows: at 16 x 4 one 4-byte index per 64 codes, and the gather of a
block row feeds 16 rows. ``K = 4`` keeps the blocks narrow along the inputs (finer pruning than 8 x 8 or
4 x 16 at the same 64 entries) while a 4-input slice is still one word to gather and one u8 x s8 quad,
the unit that VNNI's ``vpdpbusd`` sums into an int32 lane. It is also the first shape
``rlq.deploy.formats.choose_block`` tries, and 16 and 4 divide the widths of rlq's usual networks (64,
256, 400 x 300). This is a reading of the kernel's loops, not a measurement."""


def check_sparsity(sparsity: float, name: str = "sparsity") -> float:
    """Return ``sparsity`` as a float if it is a number in [0, 1), else raise ValueError."""
    return check_fraction(name, sparsity, high_open=True)


def check_block_shape(block: Sequence[int] | None, name: str = "prune_block") -> tuple[int, int] | None:
    """Return ``block`` as a ``(rows, inputs)`` pair of positive ints (None stays None), else raise ValueError."""
    if block is None:
        return None
    if (
        isinstance(block, (str, bytes))
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        raise ValueError(f"{name} is (rows, inputs), two positive ints; got {block!r}")
    return int(block[0]), int(block[1])


def pruning_block_of(layer: nn.Module, block: tuple[int, int]) -> tuple[int, int]:
    """Return the block shape ``layer``'s stored values are pruned in under ``block`` (see the module docstring).

    ``block`` for a dense weight viewed as 2-D; for a block-circulant layer one whole B-vector,
    ``(1, B * prod(kernel))`` of its vectors viewed as 2-D.
    """
    size = block_size_of(layer)
    if size is None:
        return block
    kernel = stored_tensor(*stored_target(layer)).shape[3:]
    return 1, size * math.prod(kernel)


def is_pruned(layer: nn.Module) -> bool:
    """Return whether rlq (or ``torch.nn.utils.prune``) masks ``layer``'s stored values."""
    return mask_of(*stored_target(layer)) is not None


def sparsity_of(layer: nn.Module) -> float:
    """Return the fraction of ``layer``'s stored values (weights or B-vector entries) that its mask prunes."""
    mask = mask_of(*stored_target(layer))
    if mask is None:
        return 0.0
    return 1.0 - float(mask.count_nonzero()) / mask.numel()


def magnitude_prune_(
    module: nn.Module,
    sparsity: float,
    skip_first_last: bool = True,
    scope: str = "layer",
    networks: Networks = "sequential",
    layers: Sequence[str] | None = None,
    block: Sequence[int] | None = None,
) -> CompressionReport:
    """Return a report after masking the smallest-magnitude stored values of the eligible layers in place.

    ``scope="layer"`` prunes ``sparsity`` of each layer's stored values (``prune.l1_unstructured``);
    ``scope="global"`` prunes ``sparsity`` of all eligible stored values together, by magnitude
    (``prune.global_unstructured``); note that B-vector entries, being diagonal averages, tend to be smaller
    than dense weights and so are pruned first under a global scope. ``layers`` (qualified names) overrides
    the eligibility rule (``skip_first_last``, ``networks``) of :func:`rlq.compress.eligible_layers`.
    ``block=(R, K)`` masks whole blocks by their L2 norm instead (see the module docstring); ``sparsity`` is
    then the fraction of blocks pruned, of each layer or of all of them.
    """
    sparsity = check_sparsity(sparsity)
    block = check_block_shape(block, "block")
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    if layers is None:
        targets, reasons = classify_layers(module, skip_first_last, networks)
    else:
        by_name = dict(compressible_layers(module))
        unknown = [name for name in layers if name not in by_name]
        if unknown:
            raise ValueError(f"not compressible layers of the module: {unknown}; known: {list(by_name)}")
        targets = [(name, by_name[name]) for name in layers]
        reasons = {name: "not in the given layers" for name in by_name if name not in set(layers)}
    report = CompressionReport(dense=dict(reasons), compressed=[name for name, _ in targets])
    stored = [stored_target(layer) for _, layer in targets]
    if block is not None:
        blocks = [
            (*target, pruning_block_of(layer, block))
            for target, (_, layer) in zip(stored, targets, strict=True)
        ]
        groups = [[b] for b in blocks] if scope == "layer" else [blocks] if blocks else []
        for group in groups:
            prune_global_blocks_(group, sparsity)
    elif scope == "layer":
        for target, name in stored:
            prune_l1_(target, name, sparsity)
    elif stored:
        prune_global_l1_(stored, sparsity)
    report.covered_fraction = covered_fraction_of(module, report.compressed)
    return report


def remove_pruning_(module: nn.Module) -> list[str]:
    """Return the names of the layers whose masks were made permanent (masked values set to 0, masks removed).

    Like ``prune.remove``: afterwards nothing keeps the zeros at zero during training.
    """
    removed = []
    for name, layer in compressible_layers(module):
        if bake_mask_(*stored_target(layer)) is not None:
            removed.append(name)
    return removed


def gradual_sparsity(
    step: int,
    final_sparsity: float,
    start_step: int,
    end_step: int,
    initial_sparsity: float = 0.0,
    update_every: int = 1,
) -> float:
    """Return the target sparsity at ``step`` of Zhu & Gupta's gradual pruning (arXiv 1710.01878, eq. 1).

    ``s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (t1 - t0))**3`` for ``t0 <= t <= t1``, with ``t`` rounded
    down to a multiple of ``update_every`` after ``t0`` (the paper's pruning frequency Δt); ``s_i`` before
    ``t0`` and ``s_f`` after ``t1``.
    """
    final_sparsity = check_sparsity(final_sparsity, "final_sparsity")
    initial_sparsity = check_sparsity(initial_sparsity, "initial_sparsity")
    if initial_sparsity > final_sparsity:
        raise ValueError(f"initial_sparsity {initial_sparsity} exceeds final_sparsity {final_sparsity}")
    if not 0 <= start_step <= end_step:
        raise ValueError(f"need 0 <= start_step <= end_step, got {start_step} and {end_step}")
    check_positive_int("update_every", update_every)
    if step < start_step:
        return initial_sparsity
    if step >= end_step:
        return final_sparsity
    t = start_step + (step - start_step) // update_every * update_every
    progress = (t - start_step) / (end_step - start_step)
    return final_sparsity + (initial_sparsity - final_sparsity) * (1.0 - progress) ** 3
