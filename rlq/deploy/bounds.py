"""How far a compiled policy's outputs may be from the exact forward of the module it was compiled from.

:func:`error_bound` propagates, layer by layer and per output entry, a bound ``delta`` on
``|compiled - exact|`` where *exact* is the module's forward in float64 (PyTorch's float32 forward lies
within the float32 allowance below of it). For a layer ``y = W x + b`` whose op multiplies by ``W_hat``
(dequantized codes, or the B-vectors its stored DFTs transform back to):

    delta_out = |W - W_hat| |x| + |W_hat| delta_in + R + FP32_RTOL (|W_hat| (|x| + delta_in) + |b|)

with ``x`` the exact input and ``|.|`` entrywise. ``R`` bounds the error of rounding the op's input to 8-bit
codes (:meth:`rlq.deploy.formats.PackedOp.rounding_bound`; 0 for float inputs): with the row's step ``s``
(its range, widened by ``delta_in``, over 255; one step, not half, covers a saturated top code) it is
``s |W_hat| 1`` for the dense and block-sparse int8 kernels, and ``s`` times the absolute sums of the stored
DFTs carried through the absolute inverse tables for the int8 frequency-domain kernel, which rounds its
input's DFTs. ReLU and tanh are nondecreasing: an input within ``delta`` of ``y`` gives an output between
their values at ``y - delta`` and ``y + delta``, so ``delta`` becomes the larger step from ``f(y)`` to
either (at most ``delta``; near 0 where tanh saturates or a ReLU unit stays off), plus the float32
allowance of tanh's output; the action scaling multiplies it by ``|scale|``. The first two terms are the
quantization error, exact bounds; the last is an allowance for float32 rounding (ours and PyTorch's), which
a sum of ``n`` terms keeps below ``n`` times float32's epsilon (about 6e-8) of the magnitudes and in
practice far lower: tests check it holds for every layer kind on random and trained weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlq.deploy.formats import ACTION_SCALING, PackedOp, activate
from rlq.deploy.input_scaling import INPUT_SCALING, folded_specs
from rlq.deploy.reader import LinearSpec, read_policy

FP32_RTOL = 1e-5
"""Float32 rounding allowance of :func:`error_bound`, relative to the magnitudes ``|W_hat| |x| + |b|``."""

SAME_CODES_RTOL = 1e-4
"""How far two implementations of one quantized policy (an exported C file and :func:`compile_policy`'s
forward of the same codes) may differ, relative to the action bound: the same products summed in another
order. One changed weight code moves an action by a step of that row's scale times its input, far more."""


def parity(
    actions: np.ndarray, reference: np.ndarray, tolerance: float | np.ndarray
) -> dict[str, float | bool]:
    """Compare ``actions`` with ``reference`` row by row (one row per state) against ``tolerance``.

    ``tolerance``: one number, or one per action entry (``error_bound``'s bound; reported as its largest).
    Returns the largest absolute difference, the share of states whose every action entry is within
    ``tolerance``, and ``within``: whether all are. A NaN action is never within. No rows: nothing differs.
    """
    reference = np.asarray(reference, np.float64)
    rows = reference.shape[0]
    diff = np.abs(np.asarray(actions, np.float64).reshape(rows, -1) - reference.reshape(rows, -1))
    bound = np.asarray(tolerance, np.float64)
    close = np.all(diff <= (bound.reshape(rows, -1) if bound.ndim else bound), axis=1)
    return {
        "max |difference|": float(diff.max()) if diff.size else 0.0,
        "tolerance": float(bound.max()),
        "states within": float(close.mean()) if rows else 1.0,
        "within": bool(close.all()),
    }


def _activated(y: np.ndarray, bound: np.ndarray, activation: str) -> tuple[np.ndarray, np.ndarray]:
    """Return the exact ``activation(y)`` and the bound on a computed one whose input was within ``bound`` of ``y``.

    ReLU and tanh are nondecreasing, so an input in ``[y - bound, y + bound]`` gives an output between their
    values at the two ends: the bound after them is the larger step from ``activation(y)`` to either end. It
    is at most ``bound`` (both are 1-Lipschitz), and far less where tanh saturates or ReLU stays off; after
    tanh, the float32 allowance of its output is added (tanhf rounds).
    """
    out = activate(y, activation)
    if activation == "none":
        return out, bound
    step = np.maximum(activate(y + bound, activation) - out, out - activate(y - bound, activation))
    # ReLU is exact in float32; tanhf rounds its output (a few float32 epsilons of it), which the 1-Lipschitz
    # bound used to cover and this far smaller step need not: the float32 allowance of its output is added
    return out, step + FP32_RTOL * np.abs(out) if activation == "tanh" else step


def _linear_step(
    spec: LinearSpec, op: PackedOp, x: np.ndarray, delta: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Return the exact output and its bound after one Linear layer and its activation."""
    weight = spec.weight.astype(np.float64)
    bias = np.zeros(spec.n_out) if spec.bias is None else spec.bias.astype(np.float64)
    w_hat = op.effective_weight()
    magnitude = np.abs(w_hat)
    bound = (
        np.abs(x) @ np.abs(weight - w_hat).T
        + delta @ magnitude.T
        + op.rounding_bound(x, delta)
        + FP32_RTOL * ((np.abs(x) + delta) @ magnitude.T + np.abs(bias))
    )
    return _activated(x @ weight.T + bias, bound, spec.activation)


def error_bound(module: Any, compiled: Any, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(exact, bound)``: the float64 outputs of ``module`` on ``obs`` and the bound on the compiled error.

    ``module`` is what ``compiled`` (a :class:`rlq.deploy.CompiledPolicy`) was compiled from, unchanged
    since; ``obs`` a float batch ``(batch, obs_dim)``. Both arrays have the shape of
    ``compiled.outputs(obs)`` (the network's output; continuous actions scaled), and
    ``|compiled.outputs(obs) - exact| <= bound`` entrywise (see the module docstring for the terms).
    """
    specs, _ = read_policy(module)
    ops = compiled.ops
    x = np.asarray(obs, np.float64)
    if ops and ops[0].name == INPUT_SCALING:  # powers of two: x / c and the columns times c are exact
        specs = folded_specs(specs, ops[0])
        x = x * ops[0].arrays["scale"].astype(np.float64)
        ops = ops[1:]
    same = len(ops) - len(specs) in (0, 1) and all(
        (op.name, op.n_in, op.n_out) == (spec.name, spec.n_in, spec.n_out)
        for op, spec in zip(ops, specs, strict=False)
    )
    if not same or any(op.name != ACTION_SCALING for op in ops[len(specs) :]):
        raise ValueError("compiled was not compiled from this module (its layers differ)")
    delta = np.zeros_like(x)
    for spec, op in zip(specs, ops, strict=False):
        if spec.kind == "activation":
            x, delta = _activated(x, delta, spec.activation)
            continue
        x, delta = _linear_step(spec, op, x, delta)
    for op in ops[len(specs) :]:  # the action scaling
        a = {k: v.astype(np.float64) for k, v in op.arrays.items()}
        x = np.clip(x * a["scale"] + a["shift"], a["low"], a["high"])
        delta = delta * np.abs(a["scale"]) + FP32_RTOL * np.abs(x)
    return x, delta
