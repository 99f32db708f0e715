"""Memos of tensors derived from weights: :class:`TensorMemo`, and :class:`ExpansionCache` for block-circulant expansions.

Off-policy training reads the same weights many times between two updates; what is computed from them (a dense
expansion of B-vectors, a fake-quantized weight) is reused while its input is unchanged bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from rlq.compress.circulant import _expand, _ExpandCirculant, expand_circulant

_BIT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_SAME_BITS_HEAD = 256


def _same_bits(a: Tensor, b: Tensor) -> bool:
    """Return whether ``a`` and ``b`` hold the same bits (so -0.0 differs from 0.0 and a NaN equals itself)."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    bits = _BIT_VIEWS[a.element_size()]
    a, b = a.detach().view(bits), b.detach().view(bits)
    if a.device.type == "cpu":  # numpy's comparison is about 3x faster than torch.equal here (30k entries)
        a_flat, b_flat = a.numpy().reshape(-1), b.numpy().reshape(-1)
        # a changed weight (an optimizer step moves every entry) differs at once: skip the full pass
        head = _SAME_BITS_HEAD
        return bool(np.array_equal(a_flat[:head], b_flat[:head]) and np.array_equal(a_flat, b_flat))
    return torch.equal(a, b)


class TensorMemo:
    """The value computed from the last input tensor, given back while that input is unchanged bit for bit.

    Why: off-policy training reads the same weights again and again between updates (see
    :class:`ExpansionCache`); a weight derived from them (a dense expansion, a fake-quantized weight) need
    not be recomputed. :meth:`get` returns the stored value only for an input of the same shape, dtype and
    device, with an unchanged version counter and the same bits as the snapshot :meth:`put` took. The
    version counter alone is not enough: Stable-Baselines3's ``polyak_update`` writes through ``.data``,
    which bumps no version, and a mask beneath a parametrization hands over a fresh tensor at each forward.
    The comparison costs a fraction of recomputing (numpy compares 30k entries in about 7 us); a changed
    version skips it. A stored value changed in place (its own version moved) is not given back. Inputs
    that cannot be snapshotted (:meth:`accepts`) are never stored. Copies and pickles start empty.
    """

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget the stored value (the next :meth:`get` misses)."""
        self._snapshot: Tensor | None = None
        self._version = -1
        self._value: Tensor | None = None
        self._value_version = -1

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.clear()

    @staticmethod
    def accepts(x: Tensor) -> bool:
        """Return whether ``x`` can be memoized: a plain strided tensor, outside inference mode and tracing."""
        return (
            type(x) in (Tensor, torch.nn.Parameter)
            and x.layout == torch.strided
            and x.element_size() in _BIT_VIEWS
            and x.device.type != "meta"
            and not torch.is_inference_mode_enabled()
            and not x.is_inference()
            and not torch.compiler.is_compiling()
        )

    def _stored_value(self) -> Tensor | None:
        """Return the stored value unless there is none or it was changed in place since :meth:`put`."""
        value = self._value
        if value is None or self._snapshot is None or value._version != self._value_version:
            return None
        return value

    def get(self, x: Tensor) -> Tensor | None:
        """Return the value stored for ``x`` if ``x`` is unchanged bit for bit since :meth:`put`, else None."""
        value = self._stored_value()
        if value is None or x._version != self._version or not _same_bits(x, self._snapshot):
            return None
        return value

    def put(self, x: Tensor, value: Tensor) -> None:
        """Store ``value`` (a tensor without history) as computed from ``x``'s current bits."""
        self._snapshot = x.detach().clone()
        self._version = x._version
        self._value, self._value_version = value, value._version


class ExpansionCache(TensorMemo):
    """The dense expansion of the last B-vectors expanded, reused while they are unchanged bit for bit.

    Why: off-policy training expands the same vectors again and again. TD3's target networks change only at
    the polyak update (every ``policy_delay`` steps), the actor only at its own updates, yet every forward
    (targets under no_grad, the rollout's batch-1 actor, the actor loss) expanded anew: 7 expansions of
    each hidden layer's vectors per training step where 4 differ. A hit returns the tensor of the last
    expansion (with gradients on, through a node whose backward is the usual one): the same values, bit
    for bit, as expanding again. When a hit is valid: :class:`TensorMemo`.
    """

    def expand(self, vectors: Tensor) -> Tensor:
        """Return :func:`expand_circulant` of ``vectors``, reusing the last expansion while they are unchanged."""
        if not self.accepts(vectors):
            return expand_circulant(vectors)
        dense = self.get(vectors)
        if dense is None:
            if vectors.dim() < 3:
                raise ValueError(
                    f"vectors must have shape (out/B, in/B, B, *kernel), got {tuple(vectors.shape)}"
                )
            dense = _expand(vectors.detach())
            self.put(vectors, dense)
        if torch.is_grad_enabled() and vectors.requires_grad:
            return _ExpandCirculant.apply(vectors, dense)
        return dense

    def vectors_of(self, dense: Tensor) -> Tensor | None:
        """Return the B-vectors ``dense`` is the expansion of, if it is this cache's expansion unchanged, else None.

        Why: what is computed from the dense weight row by row (QAT's per-output-channel quantization, see
        :class:`rlq.sb3.qat_stacking.MemoizedWeightFakeQuant`) can be computed from the B times smaller vectors.
        ``dense`` may be the cached tensor or an alias of it (the output of a hit with gradients on).
        """
        value = self._stored_value()
        if value is None:
            return None
        same = (
            dense.data_ptr() == value.data_ptr()
            and dense.shape == value.shape
            and dense.stride() == value.stride()
            and dense.dtype == value.dtype
            and dense.device == value.device
        )
        return self._snapshot if same else None
