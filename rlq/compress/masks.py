"""Masks through torch.nn.utils.prune, with the one fix rlq needs: pruned modules stay deep-copyable.

``torch.nn.utils.prune`` keeps ``<name>_orig`` (a Parameter) and ``<name>_mask`` (a buffer) and, before
every forward, stores ``<name> = <name>_orig * <name>_mask`` as a plain attribute. That attribute is a
non-leaf tensor after any forward with gradients on, and ``copy.deepcopy`` refuses non-leaf tensors, so a
pruned module cannot be copied (a target network, say) once it has trained. rlq adds a forward hook that
replaces the attribute by its detached value after each forward: the forward pass itself and its
gradients to ``<name>_orig`` are untouched; only reading ``layer.weight`` outside a forward gives a
tensor without history (read ``weight_orig * weight_mask`` for one with history).

Block masks (:func:`prune_blocks_`, :func:`prune_global_blocks_`) are masks like any other, given to
``prune.custom_from_mask``: a tensor is viewed as 2-D, ``(shape[0], numel / shape[0])``, cut into
``R x K`` blocks (edge blocks zero-padded), and whole blocks of smallest L2 (Frobenius) norm are masked.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils import prune


def _pruning_hooks(module: nn.Module) -> list[prune.BasePruningMethod]:
    return [h for h in module._forward_pre_hooks.values() if isinstance(h, prune.BasePruningMethod)]


def _detach_masked_attributes(module: nn.Module, inputs, output) -> None:
    for hook in _pruning_hooks(module):
        value = module.__dict__.get(hook._tensor_name)
        if isinstance(value, Tensor) and not value.is_leaf:
            setattr(module, hook._tensor_name, value.detach())


def _install_detach_hook(module: nn.Module) -> None:
    if _detach_masked_attributes not in module._forward_hooks.values():
        module.register_forward_hook(_detach_masked_attributes)
    refresh_masked_(module)


def _remove_detach_hook(module: nn.Module) -> None:
    if _pruning_hooks(module):
        return
    for key in [k for k, h in module._forward_hooks.items() if h is _detach_masked_attributes]:
        del module._forward_hooks[key]


def refresh_masked_(module: nn.Module) -> None:
    """Recompute every masked attribute of ``module`` (``orig * mask``) as a tensor without history."""
    with torch.no_grad():
        for hook in _pruning_hooks(module):
            hook(module, None)


def mask_of(module: nn.Module, name: str) -> Tensor | None:
    """Return the pruning mask of ``module.<name>`` (1 keeps, 0 prunes), or None when it is not pruned."""
    return module._buffers.get(f"{name}_mask")


def stored_tensor(module: nn.Module, name: str) -> Tensor:
    """Return the Parameter that training updates for ``module.<name>``: ``<name>_orig`` when pruned."""
    return module._parameters.get(f"{name}_orig", getattr(module, name))


def prune_with_mask_(module: nn.Module, name: str, mask: Tensor) -> None:
    """Mask ``module.<name>`` with ``mask`` through ``prune.custom_from_mask``, replacing any earlier mask."""
    bake_mask_(module, name)
    prune.custom_from_mask(module, name, mask.to(dtype=stored_tensor(module, name).dtype))
    _install_detach_hook(module)


def prune_l1_(module: nn.Module, name: str, amount: float) -> None:
    """Mask the ``amount`` fraction of smallest-magnitude entries of ``module.<name>`` (L1, per tensor)."""
    bake_mask_(module, name)
    prune.l1_unstructured(module, name, amount=amount)
    _install_detach_hook(module)


def prune_global_l1_(targets: list[tuple[nn.Module, str]], amount: float) -> None:
    """Mask the ``amount`` fraction of smallest-magnitude entries over all ``targets`` together."""
    for module, name in targets:
        bake_mask_(module, name)
    prune.global_unstructured(targets, pruning_method=prune.L1Unstructured, amount=amount)
    for module, _ in targets:
        _install_detach_hook(module)


def _as_2d(values: Tensor) -> Tensor:
    return values.detach().reshape(values.shape[0], -1)


def block_norms(values: Tensor, block: tuple[int, int]) -> Tensor:
    """Return the L2 (Frobenius) norm of each ``R x K`` block of ``values`` viewed as 2-D, shape ``(rows/R, cols/K)``.

    ``values`` is viewed as ``(shape[0], numel / shape[0])``; dimensions that ``R`` or ``K`` does not divide
    are zero-padded, so an edge block's norm is over the entries it holds.
    """
    rows, cols = block
    flat = _as_2d(values).to(torch.float64)
    padded = torch.zeros(-(-flat.shape[0] // rows) * rows, -(-flat.shape[1] // cols) * cols, dtype=flat.dtype)
    padded[: flat.shape[0], : flat.shape[1]] = flat
    tiles = padded.reshape(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols)
    return tiles.square().sum(dim=(1, 3)).sqrt()


def expand_block_mask(keep: Tensor, block: tuple[int, int], like: Tensor) -> Tensor:
    """Return the entry mask of shape ``like.shape`` for the block map ``keep`` (1 keeps a whole block)."""
    rows, cols = block
    flat = _as_2d(like)
    entries = keep.repeat_interleave(rows, dim=0).repeat_interleave(cols, dim=1)
    return entries[: flat.shape[0], : flat.shape[1]].reshape(like.shape).to(like.dtype)


def _block_masks(norms: list[Tensor], amount: float) -> list[Tensor]:
    """Return one block map per norm map: 0 for the ``round(amount * blocks)`` smallest norms over all of them."""
    flat = torch.cat([n.reshape(-1) for n in norms])
    pruned = torch.ones_like(flat)
    count = round(amount * flat.numel())  # prune's own rule for a fraction (_compute_nparams_toprune)
    if count:
        pruned[torch.topk(flat, count, largest=False).indices] = 0.0
    return [m.reshape(n.shape) for m, n in zip(pruned.split([n.numel() for n in norms]), norms, strict=True)]


def prune_blocks_(module: nn.Module, name: str, amount: float, block: tuple[int, int]) -> None:
    """Mask the ``amount`` fraction of ``module.<name>``'s ``R x K`` blocks of smallest L2 norm, whole blocks.

    Like :func:`prune_l1_`, the current mask is baked in first, so the fraction is of all blocks, and
    blocks zeroed earlier (norm 0) are the first pruned again.
    """
    prune_global_blocks_([(module, name, block)], amount)


def prune_global_blocks_(targets: list[tuple[nn.Module, str, tuple[int, int]]], amount: float) -> None:
    """Mask the ``amount`` fraction of the blocks of smallest L2 norm over all ``(module, name, block)`` together."""
    for module, name, _ in targets:
        bake_mask_(module, name)
    values = [stored_tensor(module, name) for module, name, _ in targets]
    norms = [block_norms(v, block) for v, (_, _, block) in zip(values, targets, strict=True)]
    for (module, name, block), keep, like in zip(targets, _block_masks(norms, amount), values, strict=True):
        prune_with_mask_(module, name, expand_block_mask(keep, block, like))


def bake_mask_(module: nn.Module, name: str) -> Tensor | None:
    """Return the mask removed from ``module.<name>`` (None if it had none), leaving its zeros in the values.

    This is ``prune.remove``: the Parameter object is kept, its masked entries become exactly 0.
    """
    mask = mask_of(module, name)
    if mask is None:
        return None
    mask = mask.clone()
    prune.remove(module, name)
    _remove_detach_hook(module)
    return mask
