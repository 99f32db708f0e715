"""Masks through torch.nn.utils.prune, with the one fix rlq needs: pruned modules stay deep-copyable.

``torch.nn.utils.prune`` keeps ``<name>_orig`` (a Parameter) and ``<name>_mask`` (a buffer) and, before
every forward, stores ``<name> = <name>_orig * <name>_mask`` as a plain attribute. That attribute is a
non-leaf tensor after any forward with gradients on, and ``copy.deepcopy`` refuses non-leaf tensors, so a
pruned module cannot be copied (a target network, say) once it has trained. rlq adds a forward hook that
replaces the attribute by its detached value after each forward: the forward pass itself and its
gradients to ``<name>_orig`` are untouched; only reading ``layer.weight`` outside a forward gives a
tensor without history (read ``weight_orig * weight_mask`` for one with history).
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
