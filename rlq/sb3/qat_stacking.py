"""QAT's weight quantizers on top of a compressed layer, and lifted off it while the compression changes.

Training with QAT and compression at once (:class:`rlq.sb3.qat_callback.QATCallback` beside
:class:`rlq.sb3.gst_callback.GSTCallback` or :class:`rlq.sb3.pruning_callback.GradualPruningCallback`) quantizes
what the compression stores:

- **Stacking.** The weight quantizer is always the *last* parametrization of a weight. On a
  block-circulant layer it sits on top of :class:`rlq.compress.BlockCirculantWeight`: a per-output-channel
  scale of the dense expansion is a per-block-row scale of the B-vectors (the ``B`` rows of a block row
  hold the same values), so the dense weight stays exactly block-circulant and QAT quantizes the stored
  B-vectors. On a pruned layer the mask moves onto the parametrization's ``original`` beneath the
  quantizer (:func:`stack_fake_quant_`; :func:`rlq.compress.block_circulant.stored_target` finds it
  there), so QAT quantizes the kept values and pruned entries stay exactly 0 (symmetric quantization
  maps 0 to 0).
- **Structural changes.** Every action of a compression callback runs inside :func:`fake_quant_lifted`:
  the quantizers are lifted off, the compression acts on the latent float model as it does without QAT,
  and the same quantizer objects go back on top. Weight quantizers hold no state (the scale follows the
  weights), activation ranges are per tensor (unchanged by the exact transition's reordering), and
  Parameter objects keep their identity, so the optimizers keep training them.
- **Memoized quantizers.** :class:`MemoizedWeightFakeQuant` quantizes each weight once per value it takes,
  and above a block-circulant layer quantizes its B times smaller vectors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from rlq.compress import set_forward_path_
from rlq.compress.block_circulant import expansion_cache_of, is_block_circulant
from rlq.compress.circulant import expand_circulant
from rlq.compress.expansion_cache import ExpansionCache, TensorMemo
from rlq.compress.masks import bake_mask_, prune_with_mask_
from rlq.core.parametrizations import remove_parametrizations_
from rlq.quant import WeightFakeQuant
from rlq.quant.tensor import straight_through


class MemoizedWeightFakeQuant(WeightFakeQuant):
    """:class:`rlq.quant.WeightFakeQuant` that reuses its quantized weight while its input is unchanged bit for bit.

    Why: an SB3 training step reads each weight several times between two updates of it: TD3's target
    networks (changed only by the polyak update every ``policy_delay`` steps), the batch-1 rollout actor and
    the actor loss read the same actor weights, the critic loss the ``q1`` network the actor loss read. Each
    read quantized anew, about ten passes over the weight; a hit costs one comparison
    (:class:`rlq.compress.expansion_cache.TensorMemo`, which also says when a hit is valid).

    The output is bit for bit the parent's: its unclipped straight-through output is the fake-quantized
    weight plus ``w - w.detach()`` (exactly +0.0), so the memo keeps that output's values and, with
    gradients on, gives them back with the identity gradient (:func:`rlq.quant.tensor.straight_through`,
    no copy), as the parent's.

    Above a block-circulant layer (``expansion``, set by :func:`stack_fake_quant_`) a miss quantizes the B
    times smaller B-vectors and expands the result: the B rows of a block row hold the same values as
    its vectors, so a per-output-channel (or per-tensor) scale is the same number and every entry the
    same function of the same value; the expansion copies bits.
    """

    def __init__(self, bits: int, axis: int | None = 0, layer_name: str | None = None):
        super().__init__(bits, axis, layer_name)
        self.memo = TensorMemo()
        self._memo_settings: tuple[int, int | None] | None = None
        self.expansion: ExpansionCache | None = None  # the block-circulant expansion beneath, if any
        # (B-vectors snapshot of the expansion cache, quantized dense weight, its version)
        self._by_vectors: tuple[torch.Tensor, torch.Tensor, int] | None = None

    def __getstate__(self) -> dict:
        state = dict(super().__getstate__())
        state["_by_vectors"] = None  # a copy's expansion cache starts empty: nothing to match
        return state

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        """Return the fake-quantized weight (straight-through gradient), reused while ``weight`` is unchanged."""
        if not self.enabled or not self.memo.accepts(weight):
            return super().forward(weight)
        settings = (self.bits, self.axis)
        if self._memo_settings != settings:
            self.memo.clear()
            self._by_vectors = None
            self._memo_settings = settings
        vectors = self._vectors_beneath(weight)
        if vectors is not None:
            quantized = self._quantized_from_vectors(vectors)
        else:
            quantized = self.memo.get(weight)
            if quantized is None:
                out = super().forward(weight)
                self.memo.put(weight, out.detach())
                return out
        return straight_through(weight, quantized)

    def _vectors_beneath(self, weight: torch.Tensor) -> torch.Tensor | None:
        """Return the B-vectors ``weight`` is the cached expansion of, or None (no such layer, or another axis)."""
        if self.expansion is None or self.axis not in (0, None):
            return None
        return self.expansion.vectors_of(weight)

    def _quantized_from_vectors(self, vectors: torch.Tensor) -> torch.Tensor:
        """Return the parent's (no-grad) output for the expansion of ``vectors``, computed from the vectors."""
        stored = self._by_vectors
        # the expansion cache's snapshot is private and never written: its identity names its bits
        if stored is not None and stored[0] is vectors and stored[1]._version == stored[2]:
            return stored[1]
        # the parent's no-grad output of the vectors is q(v) + 0.0, as of the dense weight; expanding copies bits
        with torch.no_grad():
            quantized = expand_circulant(super().forward(vectors))
        self._by_vectors = (vectors, quantized, quantized._version)
        return quantized


def _fake_quant_on_top(layer: nn.Module) -> list[WeightFakeQuant]:
    """Return the QAT quantizers of ``layer.weight``, checked to sit above every other parametrization."""
    if not parametrize.is_parametrized(layer, "weight"):
        return []
    stack = list(layer.parametrizations["weight"])
    quantizers = [p for p in stack if isinstance(p, WeightFakeQuant)]
    if quantizers and not all(isinstance(p, WeightFakeQuant) for p in stack[len(stack) - len(quantizers) :]):
        raise ValueError("QAT's fake quantization must be the last parametrization of the weight")
    return quantizers


def lift_fake_quant_(layer: nn.Module) -> list[WeightFakeQuant]:
    """Return the QAT quantizers taken off ``layer.weight`` in place; its compression and values stay as stored.

    The stored Parameter (dense weight or B-vectors) keeps its identity; a mask that sat beneath QAT on the
    parametrization's ``original`` moves back onto the layer's own ``weight`` (``torch.nn.utils.prune``).
    """
    quantizers = _fake_quant_on_top(layer)
    if not quantizers:
        return []
    plist = layer.parametrizations["weight"]
    if len(quantizers) == len(plist):  # QAT alone: the weight becomes the plain (maybe pruned) Parameter
        mask = bake_mask_(plist, "original")
        remove_parametrizations_(layer, "weight", leave_parametrized=False)
        if mask is not None:
            prune_with_mask_(layer, "weight", mask)
    else:  # block-circulant below: only the top of the stack goes
        for _ in quantizers:
            del plist[len(plist) - 1]
    return quantizers


def stack_fake_quant_(layer: nn.Module, quantizers: list[WeightFakeQuant]) -> None:
    """Put QAT ``quantizers`` on top of ``layer.weight``'s compression in place (see the module docstring).

    A pruned dense weight's mask moves onto the parametrization's ``original``, beneath the quantizers, so
    QAT quantizes the unpruned values and the zeros stay exact (symmetric quantization maps 0 to 0). A
    block-circulant layer keeps the dense forward path, the only one that sees the quantized weight.
    """
    if not quantizers:
        return
    mask = None
    if not parametrize.is_parametrized(layer, "weight"):
        mask = bake_mask_(layer, "weight")
    elif is_block_circulant(layer):
        set_forward_path_(layer, "dense")
    expansion = expansion_cache_of(layer)
    for position, quantizer in enumerate(quantizers):
        if isinstance(quantizer, MemoizedWeightFakeQuant):  # only the first sees the expansion
            quantizer.expansion = expansion if position == 0 else None
        parametrize.register_parametrization(layer, "weight", quantizer)
    if mask is not None:
        prune_with_mask_(layer.parametrizations["weight"], "original", mask)


@contextmanager
def fake_quant_lifted(policy: nn.Module) -> Iterator[int]:
    """Lift every QAT weight quantizer off ``policy`` inside the block and stack it back after; yield their count.

    The compression callbacks change structure inside it (:meth:`rlq.sb3.compression.CompressionCallback.\
    _changing_structure`), so block-circulant layers, transitions, the hand-over and pruning act on the
    float (latent) model exactly as without QAT, and the same quantizer objects return on top afterwards.
    """
    lifted = [(layer, lift_fake_quant_(layer)) for layer in list(policy.modules())]
    lifted = [(layer, quantizers) for layer, quantizers in lifted if quantizers]
    try:
        yield len(lifted)
    finally:
        for layer, quantizers in lifted:
            stack_fake_quant_(layer, quantizers)


__all__ = [
    "MemoizedWeightFakeQuant",
    "fake_quant_lifted",
    "lift_fake_quant_",
    "stack_fake_quant_",
]
