"""Block-circulant layers in place through ``torch.nn.utils.parametrize``: a layer stores only its B-vectors.

``block_circulant_(model, 4)`` registers a :class:`BlockCirculantWeight` parametrization (``unsafe=True``,
since the stored tensor has another shape) on the weight of every eligible ``nn.Linear`` and
``nn.Conv1d/2d/3d``. The stored tensor, ``layer.parametrizations.weight.original``, holds the B-vectors
(layout in :mod:`rlq.compress.circulant`), initialised by projecting the current weight; ``layer.weight``
is their dense expansion, recomputed at every access, so training keeps the layer exactly
block-circulant. ``state_dict``/``load_state_dict`` (into a module with the same structure, see
:func:`rlq.compress.load_compressed_state_dict_`) and ``copy.deepcopy`` work as for any parametrized module.

Forward path: by default the weight is expanded to dense and multiplied (the fastest path at the sizes of
RL networks on CPU). A block-circulant ``nn.Linear`` can instead use the FFT product
(``forward_path="fft"``) or pick, per batch size, whichever :func:`choose_forward_path` measured faster
(``"auto"``). The path is an attribute of the parametrization, kept by ``deepcopy`` but not by
``state_dict``; convolutions always use the dense path.

Pruning a block-circulant layer (see :mod:`rlq.compress.pruning`) masks the B-vector entries: the mask
sits on the parametrization's stored tensor (``parametrizations.weight.original_mask``), so the layer
stays block-circulant and stores only the unmasked vector entries.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from rlq.compress.circulant import (
    CirculantCall,
    check_block_size,
    choose_forward_path,
    circulant_matmul_fft,
    circulant_projection,
    expand_circulant,
)
from rlq.compress.expansion_cache import ExpansionCache
from rlq.compress.layers import (
    CompressionReport,
    Networks,
    _is_compressible,
    classify_layers,
    compressible_layers,
    covered_fraction_of,
)
from rlq.compress.masks import bake_mask_, mask_of, prune_with_mask_, stored_tensor
from rlq.core.parametrizations import remove_parametrizations_

FORWARD_PATHS = ("dense", "fft", "auto")
INITS = ("projection", "scaled")
"""How :func:`block_circulant_` sets the B-vectors from the current weight: ``"projection"``, the nearest
block-circulant matrix (each cyclic diagonal averaged: right for a trained weight), or ``"scaled"``, that
projection rescaled to the Frobenius norm of the weight it replaces. Averaging B i.i.d. entries divides their
std by sqrt(B), so the projection of a fresh initialisation is about sqrt(B) times too small (at B = 4 a TD3
hidden layer's spectral norm halves, and a stack of such layers shrinks its features layer by layer);
scaled, the weight keeps the initialisation's entry std exactly, so a layer's mean gain on isotropic
inputs is kept. For an i.i.d. initialisation (PyTorch's default) the spectral norm is kept too, within a
few percent; an orthogonal initialisation's flat spectrum is not (the scaled weight's spectral norm is
that of a random matrix of the same std, 1.4-1.8 times the orthogonal one's at B = 2-8)."""


class BlockCirculantWeight(nn.Module):
    """Parametrization of a weight as block-circulant: stores B-vectors, returns the dense expansion."""

    def __init__(self, block_size: int, forward_path: str = "dense"):
        super().__init__()
        self.block_size = check_block_size(block_size)
        self.forward_path = _check_forward_path(forward_path)
        # target networks and the rollout actor reuse one expansion per value of their B-vectors
        self.expansion_cache = ExpansionCache()

    def forward(self, vectors: Tensor) -> Tensor:
        """Return the dense block-circulant weight of the stored B-vectors (reused while they are unchanged)."""
        return self.expansion_cache.expand(vectors)

    def right_inverse(self, weight: Tensor) -> Tensor:
        """Return the B-vectors to store for ``weight``: its Frobenius projection (used at registration)."""
        return circulant_projection(weight, self.block_size)

    def extra_repr(self) -> str:
        return f"block_size={self.block_size}, forward_path={self.forward_path!r}"


def _check_forward_path(path: str) -> str:
    if path not in FORWARD_PATHS:
        raise ValueError(f"forward_path must be one of {FORWARD_PATHS}, got {path!r}")
    return path


def _parametrization(layer: nn.Module) -> BlockCirculantWeight | None:
    if not parametrize.is_parametrized(layer, "weight"):
        return None
    return next((p for p in layer.parametrizations.weight if isinstance(p, BlockCirculantWeight)), None)


def is_block_circulant(layer: nn.Module) -> bool:
    """Return whether ``layer``'s weight is parametrized as block-circulant by rlq."""
    return _parametrization(layer) is not None


def expansion_cache_of(layer: nn.Module) -> ExpansionCache | None:
    """Return the expansion cache of a block-circulant layer, or None for any other layer."""
    p = _parametrization(layer)
    return None if p is None else p.expansion_cache


def block_size_of(layer: nn.Module) -> int | None:
    """Return the block size B of a block-circulant layer, or None for any other layer."""
    p = _parametrization(layer)
    return None if p is None else p.block_size


def stored_target(layer: nn.Module) -> tuple[nn.Module, str]:
    """Return ``(module, name)`` of the tensor that holds a layer's stored values (and its pruning mask).

    For a layer whose weight is parametrized it is the parametrization's ``original``: the B-vectors of a
    block-circulant layer, or the latent weight beneath QAT's fake quantization (``rlq.sb3`` stacks QAT on
    top of the compression, so the mask sits on the values QAT quantizes); else ``weight``.
    """
    if parametrize.is_parametrized(layer, "weight"):
        return layer.parametrizations.weight, "original"
    return layer, "weight"


def circulant_vectors(layer: nn.Module) -> Tensor:
    """Return the B-vectors a block-circulant layer currently uses, its pruning mask applied."""
    if not is_block_circulant(layer):
        raise ValueError(f"{type(layer).__name__} is not block-circulant")
    plist = layer.parametrizations.weight
    mask = mask_of(plist, "original")
    values = stored_tensor(plist, "original")
    return values if mask is None else values * mask


def block_circulant_(
    module: nn.Module,
    block_size: int,
    skip_first_last: bool = True,
    networks: Networks = "sequential",
    forward_path: str = "dense",
    init: str = "projection",
) -> CompressionReport:
    """Return a report after making every eligible layer of ``module`` block-circulant in place.

    Eligible layers are those of :func:`rlq.compress.eligible_layers` (``networks`` and ``skip_first_last``
    as there). A layer whose two leading weight dimensions ``block_size`` does not divide stays dense and
    is reported in ``report.dense``. Layers already block-circulant with the same B are kept (and listed
    as compressed); another B is an error (use a transition). The B-vectors are the Frobenius projection
    of the current weights, rescaled to their Frobenius norm with ``init="scaled"`` (for a fresh initialisation, see
    :data:`INITS`). Parameter objects are kept, so an existing optimizer still holds them; reset
    its state (:func:`rlq.compress.reset_optimizer_state_`) if it has stepped.
    """
    check_block_size(block_size)
    _check_forward_path(forward_path)
    _check_init(init)
    eligible, report_dense = classify_layers(module, skip_first_last, networks)
    report = CompressionReport(dense=dict(report_dense))
    to_convert = []
    for name, layer in eligible:  # check every layer before changing any
        current = block_size_of(layer)
        if current is not None:
            if current != block_size:
                raise ValueError(
                    f"layer {name!r} is already block-circulant with B={current}; change B with "
                    "transition_projection_ or transition_exact_"
                )
        elif parametrize.is_parametrized(layer, "weight"):
            raise ValueError(f"layer {name!r} already has another parametrization on its weight")
        elif mask_of(layer, "weight") is not None:
            raise ValueError(f"layer {name!r} is pruned; remove its pruning before making it block-circulant")
        else:
            out, inp = layer.weight.shape[:2]
            if out % block_size or inp % block_size:
                report.dense[name] = f"B={block_size} does not divide its {out}x{inp} weight (kept dense)"
                continue
            to_convert.append(layer)
        report.compressed.append(name)
    for layer in to_convert:
        make_block_circulant_(layer, block_size, forward_path, init)
    report.covered_fraction = covered_fraction_of(module, report.compressed)
    return report


def make_block_circulant_(
    layer: nn.Module, block_size: int, forward_path: str = "dense", init: str = "projection"
) -> None:
    """Make one Linear/convolution block-circulant in place (B-vectors from its current weight, see :data:`INITS`)."""
    _check_layer(layer)
    check_block_size(block_size)
    _check_init(init)
    if parametrize.is_parametrized(layer, "weight"):
        raise ValueError(f"{type(layer).__name__} already has a parametrization on its weight")
    if mask_of(layer, "weight") is not None:
        raise ValueError(
            f"{type(layer).__name__} is pruned; remove its pruning before making it block-circulant"
        )
    dense_norm = float(torch.linalg.vector_norm(layer.weight.detach()))
    parametrize.register_parametrization(layer, "weight", BlockCirculantWeight(block_size), unsafe=True)
    if init == "scaled":
        vectors = layer.parametrizations.weight.original
        # each vector entry stands B times in its block: |expansion|_F = sqrt(B) |vectors|
        norm = block_size**0.5 * float(torch.linalg.vector_norm(vectors.detach()))
        if norm > 0:
            with torch.no_grad():
                vectors.mul_(dense_norm / norm)
    _set_layer_forward_path(layer, _check_forward_path(forward_path))


def _check_init(init: str) -> str:
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    return init


def _circulant_linear_forward(self: nn.Linear, x: Tensor) -> Tensor:
    """Forward of a block-circulant Linear that may take the FFT path (installed by ``set_forward_path_``)."""
    path = _parametrization(self).forward_path
    vectors = circulant_vectors(self)
    if path == "auto":
        batch = x.numel() // max(x.shape[-1], 1)
        training = torch.is_grad_enabled() and (vectors.requires_grad or x.requires_grad)
        call = CirculantCall(
            self.out_features, self.in_features, vectors.shape[2], batch, training, x.device, x.dtype
        )
        path = choose_forward_path(call)
    if path == "fft":
        y = circulant_matmul_fft(x, vectors)
        return y if self.bias is None else y + self.bias
    return F.linear(x, self.weight, self.bias)


def _set_layer_forward_path(layer: nn.Module, path: str) -> bool:
    p = _parametrization(layer)
    if p is None:
        return False
    if not isinstance(layer, nn.Linear):
        p.forward_path = "dense"
        return False
    p.forward_path = path
    if path == "dense":
        layer.__dict__.pop("forward", None)
    else:
        layer.forward = types.MethodType(_circulant_linear_forward, layer)
    return True


def set_forward_path_(module: nn.Module, path: str) -> int:
    """Return how many block-circulant Linear layers of ``module`` now use forward ``path``.

    ``"dense"`` expands the B-vectors and multiplies (default); ``"fft"`` uses
    :func:`rlq.compress.circulant_matmul_fft`; ``"auto"`` asks :func:`rlq.compress.choose_forward_path`
    per batch size (measured once per shape). Convolutions keep the dense path.
    """
    _check_forward_path(path)
    return sum(_set_layer_forward_path(layer, path) for _, layer in compressible_layers(module))


def set_circulant_vectors_(
    layer: nn.Module, vectors: Tensor, block_size: int, mask: Tensor | None = None
) -> None:
    """Replace a block-circulant layer's B-vectors (and block size, and vector mask) in place.

    The stored Parameter keeps its identity (its data is swapped with ``set_``, as parametrize does), so an
    optimizer still holds it; its optimizer state must be reset since the shape may change.
    """
    p = _parametrization(layer)
    if p is None:
        raise ValueError(f"{type(layer).__name__} is not block-circulant")
    plist = layer.parametrizations.weight
    bake_mask_(plist, "original")
    original = plist.original
    with torch.no_grad():
        original.set_(vectors.detach().to(dtype=original.dtype, device=original.device).clone())
    p.block_size = check_block_size(block_size)
    p.expansion_cache.clear()  # its bits would miss anyway; this frees the old expansion now
    if mask is not None:
        prune_with_mask_(plist, "original", mask)


def remove_block_circulant_(module: nn.Module, keep_pruning: bool = True) -> list[str]:
    """Return the names of the layers made dense again, keeping their current (expanded) weights.

    Like ``parametrize.remove_parametrizations(..., leave_parametrized=True)``: the weight becomes a plain
    Parameter (the same object) holding the dense block-circulant matrix. A layer whose B-vectors were
    pruned keeps an equivalent dense mask when ``keep_pruning`` (each masked vector entry masks its B
    positions in every block), so the function and the zeros are unchanged.
    """
    removed = []
    for name, layer in compressible_layers(module):
        if not is_block_circulant(layer):
            continue
        plist = layer.parametrizations.weight
        mask = bake_mask_(plist, "original")
        layer.__dict__.pop("forward", None)
        remove_parametrizations_(layer, "weight", leave_parametrized=True)
        if mask is not None and keep_pruning:
            prune_with_mask_(layer, "weight", expand_circulant(mask))
        removed.append(name)
    return removed


def _check_layer(layer: nn.Module) -> None:
    if not _is_compressible(layer):
        raise TypeError(f"expected nn.Linear or nn.Conv1d/2d/3d, got {type(layer).__name__}")
