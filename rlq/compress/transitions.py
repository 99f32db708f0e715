"""Changing the block size of block-circulant layers during training: by projection, or exactly.

GST (Lee et al., arXiv 2101.09650) compares ways to change B mid-training and uses a matrix transformation
to keep parameter values from moving; the transformation is not published. rlq's exact method is our own
design built on one fact: a BxB circulant block whose rows and columns are both reordered by residue
mod f (for B=4, f=2: ``[0, 2, 1, 3]``) is exactly an f x f grid of (B/f)-circulant blocks
(:func:`rlq.compress.circulant.residue_permutation`). Reordering the rows of a layer means reordering its
output units, so the same reordering is applied to the next layer's input columns and the network
computes the same function. The plain projection instead moves values (see :func:`transition_projection_`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rlq.compress.block_circulant import (
    block_size_of,
    circulant_vectors,
    is_block_circulant,
    set_circulant_vectors_,
    stored_target,
)
from rlq.compress.circulant import (
    check_block_size,
    circulant_projection,
    expand_circulant,
    residue_permutation,
    split_circulant_vectors,
)
from rlq.compress.layers import (
    CompressionReport,
    Networks,
    _is_compressible,
    compressible_layers,
    covered_fraction_of,
    find_networks,
)
from rlq.compress.masks import bake_mask_, mask_of, prune_l1_, refresh_masked_
from rlq.core.validation import check_positive_int


def parameter_shift(before: Tensor, after: Tensor) -> float:
    """Return the relative change ``||after - before||_F / ||before||_F`` of a weight (0 when equal)."""
    if before.shape != after.shape:
        raise ValueError(f"shapes differ: {tuple(before.shape)} and {tuple(after.shape)}")
    norm = float(torch.linalg.vector_norm(before))
    diff = float(torch.linalg.vector_norm(after - before))
    return diff / norm if norm > 0 else diff


def transition_projection_(module: nn.Module, new_block_size: int) -> CompressionReport:
    """Return a report after re-projecting every block-circulant layer onto block size ``new_block_size``.

    Each layer's current dense weight is replaced by its Frobenius-nearest ``new_block_size``
    block-circulant matrix; ``report.shift`` holds each layer's relative weight change. A layer whose
    dimensions ``new_block_size`` does not divide keeps its block size (listed in ``report.dense``). Pruned
    B-vectors are re-pruned to the same sparsity by magnitude.
    """
    check_block_size(new_block_size)
    report = CompressionReport()
    for name, layer in compressible_layers(module):
        if not is_block_circulant(layer):
            continue
        before = expand_circulant(circulant_vectors(layer)).detach()
        out, inp = before.shape[:2]
        if out % new_block_size or inp % new_block_size:
            report.dense[name] = (
                f"B={new_block_size} does not divide its {out}x{inp} weight (kept B={block_size_of(layer)})"
            )
            continue
        target, tensor_name = stored_target(layer)
        mask = mask_of(target, tensor_name)
        sparsity = 0.0 if mask is None else 1.0 - float(mask.count_nonzero()) / mask.numel()
        set_circulant_vectors_(layer, circulant_projection(before, new_block_size), new_block_size)
        if mask is not None:
            prune_l1_(target, tensor_name, sparsity)
        report.shift[name] = parameter_shift(before, expand_circulant(circulant_vectors(layer)).detach())
        report.compressed.append(name)
    report.covered_fraction = covered_fraction_of(module, report.compressed)
    return report


def _units(layer: nn.Module) -> tuple[int, int]:
    """Return (output units, input units) of a Linear or convolution."""
    if isinstance(layer, nn.Linear):
        return layer.out_features, layer.in_features
    return layer.out_channels, layer.in_channels


def _leaves(module: nn.Module) -> list[nn.Module]:
    """Return the modules a forward pass through ``module`` runs, layers kept whole, in order."""
    children = list(module.children())
    if _is_compressible(module) or not children:
        return [module]
    return [leaf for child in children for leaf in _leaves(child)]


def _check_chain(network: nn.Sequential | Sequence[nn.Module]) -> list[nn.Module]:
    if isinstance(network, nn.Sequential):
        leaves = _leaves(network)
        layers = [m for m in leaves if _is_compressible(m)]
        if layers:
            first, last = leaves.index(layers[0]), leaves.index(layers[-1])
            for between in leaves[first:last]:
                if _is_compressible(between):
                    continue
                if any(True for _ in between.parameters()) or any(True for _ in between.buffers()):
                    raise ValueError(
                        f"{type(between).__name__} between the layers holds per-unit parameters or buffers; "
                        "the exact split needs element-wise operations between layers"
                    )
        return layers
    layers = list(network)
    for layer in layers:
        if not _is_compressible(layer):
            raise TypeError(f"expected nn.Linear or nn.Conv1d/2d/3d layers, got {type(layer).__name__}")
    return layers


def _permute_dense_(layer: nn.Module, rows: Tensor | None, cols: Tensor | None) -> None:
    """Reorder a dense layer's output units (rows, and bias) and input units (columns), mask included."""
    if cols is not None and isinstance(layer, nn.modules.conv._ConvNd) and layer.groups != 1:
        raise ValueError("cannot reorder the input channels of a grouped convolution")
    target, name = stored_target(layer)
    tensors = [target._parameters.get(f"{name}_orig", target._parameters.get(name))]
    mask = mask_of(target, name)
    if mask is not None:
        tensors.append(mask)
    with torch.no_grad():
        for tensor in tensors:
            if rows is not None:
                tensor.copy_(tensor[rows])
            if cols is not None:
                tensor.copy_(tensor[:, cols])
        if rows is not None and layer.bias is not None:
            layer.bias.copy_(layer.bias[rows])
    refresh_masked_(target)


def split_blocks_exact_(network: nn.Sequential | Sequence[nn.Module], factor: int = 2) -> list[float | None]:
    """Return each layer's relative weight shift (None: not block-circulant) after splitting B to B/factor.

    ``network`` is one chain of layers in forward order, as an ``nn.Sequential`` (checked: only modules
    without parameters or buffers, i.e. element-wise operations, may sit between the layers) or as a
    sequence of layers (the caller guarantees that layer k's outputs feed only layer k+1, element-wise).
    Every block-circulant layer gets its rows and columns reordered by residue mod ``factor`` inside each
    B-block and becomes (B/factor)-block-circulant with the same values; the hidden units between two
    layers are reordered consistently (rows and bias of one layer, columns of the next, masks included),
    so the network's function is unchanged. The network's own inputs and outputs cannot be reordered, so
    its first and last layer must not be block-circulant. Pruned B-vectors keep their zeros.
    """
    check_positive_int("factor", factor)
    layers = _check_chain(network)
    sizes = [block_size_of(layer) for layer in layers]
    count = len(layers)
    for index, size in enumerate(sizes):
        if size is None:
            continue
        if size % factor:
            raise ValueError(f"factor {factor} does not divide the block size {size} of layer {index}")
        if index in (0, count - 1):
            where = "first" if index == 0 else "last"
            raise ValueError(
                f"the {where} layer of the network is block-circulant; its "
                f"{'inputs' if index == 0 else 'outputs'} are the network's and cannot be reordered"
            )
    perms: list[Tensor | None] = []
    for index in range(count - 1):
        out_units, next_in = _units(layers[index])[0], _units(layers[index + 1])[1]
        if out_units != next_in:
            raise ValueError(
                f"layer {index} has {out_units} outputs but layer {index + 1} has {next_in} inputs; "
                "the exact split needs a plain chain of layers"
            )
        neighbours = {size for size in (sizes[index], sizes[index + 1]) if size is not None}
        if len(neighbours) > 1:
            raise ValueError(
                f"layers {index} and {index + 1} have different block sizes {sorted(neighbours)}"
            )
        perms.append(residue_permutation(out_units, neighbours.pop(), factor) if neighbours else None)
    shifts: list[float | None] = []
    for index, layer in enumerate(layers):
        rows = perms[index] if index < count - 1 else None
        cols = perms[index - 1] if index > 0 else None
        if sizes[index] is None:
            if rows is not None or cols is not None:
                _permute_dense_(layer, rows, cols)
            shifts.append(None)
            continue
        target, name = stored_target(layer)
        before = expand_circulant(circulant_vectors(layer)).detach()[rows][:, cols]
        mask = bake_mask_(target, name)
        values = target.original.detach()
        new_mask = None if mask is None else split_circulant_vectors(mask, factor)
        set_circulant_vectors_(
            layer, split_circulant_vectors(values, factor), sizes[index] // factor, new_mask
        )
        if layer.bias is not None:
            with torch.no_grad():
                layer.bias.copy_(layer.bias[rows])
        shifts.append(parameter_shift(before, expand_circulant(circulant_vectors(layer)).detach()))
    return shifts


def record_shifts(report: CompressionReport, names: Sequence[str], shifts: Sequence[float | None]) -> None:
    """Add each split layer (a shift that is not None) to ``report``'s compressed layers and shifts."""
    for name, shift in zip(names, shifts, strict=True):
        if shift is not None:
            report.shift[name] = shift
            report.compressed.append(name)


def transition_exact_(
    module: nn.Module, new_block_size: int, networks: Networks = "sequential"
) -> CompressionReport:
    """Return a report after splitting every block-circulant layer to ``new_block_size`` with zero shift.

    Applies :func:`split_blocks_exact_` to each network of :func:`rlq.compress.find_networks`; each must be
    one ``nn.Sequential`` (checked for element-wise operations between its layers), else ValueError. Each network's
    block-circulant layers must share one block size, a multiple of ``new_block_size``.
    """
    check_block_size(new_block_size)
    report = CompressionReport()
    for network in find_networks(module, networks):
        sizes = {block_size_of(layer) for _, layer in network} - {None}
        if not sizes:
            continue
        if len(sizes) > 1:
            raise ValueError(f"a network holds block sizes {sorted(sizes)}; the exact split needs one")
        size = sizes.pop()
        if size % new_block_size:
            raise ValueError(f"new block size {new_block_size} does not divide the current block size {size}")
        if size == new_block_size:
            continue
        names = [name for name, _ in network]
        container = _common_sequential(module, names)
        if container is None:
            # Outside an nn.Sequential the data flow is unknown (a ResNet's shortcuts, BatchNorm): reordering
            # hidden units could silently change the function (measured: 37% on ResNet-32), so refuse.
            raise ValueError(
                f"the exact split needs each network to be one nn.Sequential chain, but {names} are not; "
                "use transition_projection_, or split_blocks_exact_ on a chain you have checked"
            )
        record_shifts(report, names, split_blocks_exact_(container, size // new_block_size))
    report.covered_fraction = covered_fraction_of(module, report.compressed)
    return report


def _common_sequential(module: nn.Module, names: list[str]) -> nn.Sequential | None:
    """Return the innermost nn.Sequential holding exactly the layers ``names``, if there is one."""
    prefix = names[0].split(".")[:-1]
    for name in names[1:]:
        parts = name.split(".")[:-1]
        while prefix and parts[: len(prefix)] != prefix:
            prefix = prefix[:-1]
    container = module.get_submodule(".".join(prefix))
    if not isinstance(container, nn.Sequential):
        return None
    inside = [m for m in container.modules() if _is_compressible(m)]
    return container if len(inside) == len(names) else None
