"""Loading a compressed module's state_dict into a freshly built (dense) module.

A compressed layer's ``state_dict`` has other keys than a dense one (``parametrizations.weight.original``,
``weight_orig``/``weight_mask``, ...), so ``load_state_dict`` into a newly constructed model fails: the
structure must be re-applied first. :func:`load_compressed_state_dict_` reads the structure from the keys
themselves, so a checkpoint needs nothing besides its state_dict.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from rlq.compress.block_circulant import (
    block_size_of,
    make_block_circulant_,
    remove_block_circulant_,
    stored_target,
)
from rlq.compress.layers import compressible_layers
from rlq.compress.masks import bake_mask_, mask_of, prune_with_mask_, refresh_masked_


def compression_structure(state_dict: Mapping[str, Tensor], module: nn.Module) -> dict[str, dict[str, Any]]:
    """Return, per compressible layer of ``module``, the structure ``state_dict`` was saved with.

    Each entry is ``{"block_size": B or None, "pruned": bool}``.
    """
    structure = {}
    for name, _ in compressible_layers(module):
        prefix = f"{name}." if name else ""
        vectors = state_dict.get(f"{prefix}parametrizations.weight.original")
        if vectors is None:
            vectors = state_dict.get(f"{prefix}parametrizations.weight.original_orig")
        pruned = (
            f"{prefix}weight_mask" in state_dict
            or f"{prefix}parametrizations.weight.original_mask" in state_dict
        )
        structure[name] = {"block_size": None if vectors is None else int(vectors.shape[2]), "pruned": pruned}
    return structure


def load_compressed_state_dict_(
    module: nn.Module, state_dict: Mapping[str, Tensor], strict: bool = True
) -> dict[str, dict[str, Any]]:
    """Return the structure applied after giving ``module`` the compression of ``state_dict`` and loading it.

    Layers are made block-circulant (with the saved B) or dense, and masked, as the keys say, then
    ``module.load_state_dict(state_dict, strict)`` loads every value and mask. A ``state_dict`` that does not
    fit (another architecture, a missing key) raises ValueError naming the mismatch and leaves ``module``
    untouched (it is tried on a copy first). Forward paths other than the default dense one are not part
    of a state_dict; set them again with ``set_forward_path_``.
    """
    structure = compression_structure(state_dict, module)
    trial = copy.deepcopy(module)  # tried on a copy first: a misfit never half-converts ``module``
    try:
        _restructure_(trial, structure)
        trial.load_state_dict(state_dict, strict=strict)
    except (RuntimeError, ValueError) as e:  # a size mismatch, a missing key, a B that does not divide
        raise ValueError(
            f"the state_dict does not fit this {type(module).__name__} (left as it was): {e}"
        ) from e
    del trial
    _restructure_(module, structure)
    module.load_state_dict(state_dict, strict=strict)
    for _, layer in compressible_layers(module):
        refresh_masked_(stored_target(layer)[0])
    return structure


def _restructure_(module: nn.Module, structure: Mapping[str, Mapping[str, Any]]) -> None:
    """Make each compressible layer of ``module`` block-circulant or dense, and masked, as ``structure`` says."""
    for name, layer in compressible_layers(module):
        wanted = structure[name]
        target, tensor_name = stored_target(layer)
        current = {"block_size": block_size_of(layer), "pruned": mask_of(target, tensor_name) is not None}
        if current == wanted:
            continue
        bake_mask_(target, tensor_name)
        remove_block_circulant_(layer, keep_pruning=False)
        if wanted["block_size"] is not None:
            make_block_circulant_(layer, wanted["block_size"])
        if wanted["pruned"]:
            target, tensor_name = stored_target(layer)
            prune_with_mask_(target, tensor_name, torch.ones_like(getattr(target, tensor_name)))
