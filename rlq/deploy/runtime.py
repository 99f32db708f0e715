"""``compile_policy``: a compressed actor as one call to compiled kernels, each layer in its stored form.

Which kernel a layer gets (:func:`plan_layer`):

- a block-circulant layer (rlq's parametrization, B in 2, 4, 8, 16, 32) runs in the frequency domain
  (:class:`rlq.deploy.frequency.Circulant`) at ``circulant_precision`` (float32, int8 or int16 DFTs);
  another B runs as a dense layer of its expansion;
- at ``precision="int8"``, a pruned layer whose zeros fill whole blocks runs block-sparse
  (:class:`rlq.deploy.formats.SparseI8`, block shape by :func:`rlq.deploy.formats.choose_block`, which
  the compiled kernels' vector path steers to 64-byte blocks, or ``sparse_block``), every other layer dense
  int8 (:class:`rlq.deploy.formats.DenseI8`);
- at ``precision="fp32"``, every other layer runs as a float32 matrix (:class:`rlq.deploy.formats.DenseF32`).

The compiled module ``rlq/deploy/_policy_kernels.c`` (built by ``setup.py`` where a C compiler is present,
with ``-march=native``) runs every op of a whole batch in one call, layer by layer on tiles of up to 64
rows: each block of weights is read from memory once per tile and applied to all its rows (which saves most
where the weights do not fit in cache), and each row's result is bit for bit what it is alone. Without it, or with
``RLQ_DEPLOY_KERNELS=0``, the same ops run in NumPy: the dense and block-sparse int8 ops give the same
integer sums and agree to float32 rounding, the float frequency-domain ops to
:data:`rlq.deploy.bounds.FP32_RTOL`, and the int8 frequency-domain op, whose input DFTs may round to the
next code where the two compute them in another order, within :func:`rlq.deploy.error_bound`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlq.core.kernels import kernels_switched_on
from rlq.deploy.formats import (
    ACTION_SCALING,
    LOW_BITS,
    MAX_SPARSE_DENSITY,
    SPARSE_BLOCKS,
    Affine,
    DenseF32,
    DenseI8,
    DenseLowBit,
    PackedOp,
    SparseI8,
    check_block,
    choose_block,
    kept_blocks,
)
from rlq.deploy.frequency import KERNEL_BLOCK_SIZES, PRECISIONS, Circulant
from rlq.deploy.input_scaling import fold_input_scales, input_scales
from rlq.deploy.reader import LinearSpec, OutputSpec, read_policy

_FLOAT32 = np.dtype(np.float32)
_DISCRETE_KINDS = ("argmax", "multi_argmax", "binary")
"""Output kinds whose actions are taken from the network's output (the others return it as it is)."""

try:  # built by setup.py where a C compiler is present; optional
    from rlq.deploy import _policy_kernels
except ImportError:  # pragma: no cover - depends on the install
    _policy_kernels = None

USE_KERNELS = kernels_switched_on("RLQ_DEPLOY_KERNELS")
"""Whether compiled policies use the compiled kernels when they are built (``RLQ_DEPLOY_KERNELS=0`` to compare)."""
LAYER_PRECISIONS = ("fp32", "int8", *(f"int{b}" for b in LOW_BITS))
"""How layers that are not block-circulant are stored: fp32, int8, or 2-7-bit codes packed (:class:`DenseLowBit`,
which the NumPy forward and the exported C file run, not the compiled kernels)."""


NO_ACTION = -1
"""The discrete action of an observation that is not finite (see :class:`CompiledPolicy`): no valid index."""


FALLBACK_WARNING = (
    "rlq.deploy runs compiled policies in its NumPy fallback, about 50x slower at batch 1: the C kernels "
    "(rlq/deploy/_policy_kernels.c) are not built; run `python setup.py build_ext --inplace` with a C compiler"
)
"""The one line :func:`compile_policy` warns with, once per process, when it falls back for want of the build."""
_fallback_warned = [False]  # one warning per process: a per-call warning would flood an evaluation loop


def kernels_available() -> bool:
    """Return whether the compiled policy kernels (``rlq/deploy/_policy_kernels.c``) were built with this install."""
    return _policy_kernels is not None


def _warn_fallback_once() -> None:
    """Warn (``RuntimeWarning``, one line) the first time a policy runs in NumPy because the kernels are not built."""
    if not _fallback_warned[0]:
        _fallback_warned[0] = True
        warnings.warn(FALLBACK_WARNING, RuntimeWarning, stacklevel=3)


def vector_blocks(use_kernels: bool) -> bool:
    """Return whether policies run with ``use_kernels`` sum 64-byte int8 blocks with vector multiply-adds
    (the kernels are built, for a CPU with AVX-512 VNNI or AVX2): what :func:`choose_block` is told."""
    return bool(
        use_kernels and _policy_kernels is not None and _policy_kernels.constants()["VECTOR_I8_BLOCKS"]
    )


def plan_layer(
    spec: LinearSpec,
    precision: str,
    circulant_precision: str,
    sparse_block: tuple[int, int] | None,
    max_sparse_density: float,
    vector: bool = False,
) -> PackedOp:
    """Return the op one layer runs as (see the module docstring for the rule); ``vector``: the engine sums
    64-byte int8 blocks with vector multiply-adds (:func:`vector_blocks`)."""
    if spec.kind == "activation":
        return Affine.identity(spec.name, spec.n_out, spec.activation)
    if spec.vectors is not None and spec.vectors.shape[2] in KERNEL_BLOCK_SIZES:
        return Circulant(spec, circulant_precision)
    if precision == "fp32":
        return DenseF32(spec)
    if precision != "int8":
        return DenseLowBit(spec, int(precision[3:]))
    nonzero = (spec.weight if spec.int8 is None else spec.int8[0]) != 0
    if sparse_block is not None:
        density = float(kept_blocks(nonzero, sparse_block).mean())
        return SparseI8(spec, sparse_block) if density <= max_sparse_density else DenseI8(spec)
    block = choose_block(nonzero, SPARSE_BLOCKS, max_sparse_density, vector) if not nonzero.all() else None
    return DenseI8(spec) if block is None else SparseI8(spec, block)


class CompiledPolicy:
    """A policy compiled by :func:`compile_policy`: call it on a float32 ``(batch, obs_dim)`` array.

    ``policy(obs)`` returns what SB3's deterministic ``predict`` returns for a batch (actions scaled or
    clipped to the action space; argmax for discrete actions), or the network's output for an
    ``nn.Sequential``; :meth:`outputs` the network's output before any argmax. ``ops`` lists the packed
    layers; ``compiled`` says whether the C kernels run them (else NumPy does).

    An observation holding NaN or an infinity in any element gives no action: its outputs and continuous
    actions are NaN in every element, its discrete actions :data:`NO_ACTION` (-1), whatever the network would
    compute from it (``tanh(inf)`` is a finite 1). Every exported format does the same (docs/deploy.md).
    """

    def __init__(self, ops: list[PackedOp], output: OutputSpec, obs_dim: int, use_kernels: bool):
        self.ops = ops
        self.output = output
        self.obs_dim = obs_dim
        self.out_dim = ops[-1].n_out
        # an op without a compiled kernel (a low-bit layer) runs the whole policy in NumPy
        self.compiled = bool(use_kernels and _policy_kernels is not None and all(op.code_name for op in ops))
        self._program = self._build_program() if self.compiled else None
        self._program_ptr = 0 if self._program is None else int(self._program.__array_interface__["data"][0])
        # __call__'s short path: the kernels' output is the result (no argmax to take)
        self._outputs_are_actions = self._program is not None and output.kind not in _DISCRETE_KINDS

    def _build_program(self) -> np.ndarray:
        c = _policy_kernels.constants()
        words = [c["VERSION"], len(self.ops), self.obs_dim, self.out_dim]
        width = max(max(op.work_floats() for op in self.ops), self.obs_dim) + c["LANES"]
        nbytes = max([op.work_bytes() for op in self.ops] + [0])
        words += [width, nbytes] + [0] * (c["HEADER_WORDS"] - 6)
        for op in self.ops:
            words += op.words(c, c["OP_WORDS"])
        return np.array(words, dtype=np.int64)

    def _check(self, obs: Any) -> np.ndarray:
        if not isinstance(obs, np.ndarray):
            raise TypeError(f"a compiled policy takes a numpy float32 array, got {type(obs).__name__}")
        if obs.dtype != np.float32:
            raise TypeError(f"a compiled policy takes float32 observations, got dtype {obs.dtype}")
        if obs.ndim != 2 or obs.shape[1] != self.obs_dim:
            raise ValueError(
                f"a compiled policy takes observations of shape (batch, {self.obs_dim}), got {obs.shape}"
            )
        return obs if obs.flags.c_contiguous else np.ascontiguousarray(obs)

    def outputs(self, obs: np.ndarray) -> np.ndarray:
        """Return the network's float32 output ``(batch, out)`` for ``obs`` (continuous actions already scaled).

        A row of ``obs`` holding NaN or an infinity gives a row of NaN (see the class docstring).
        """
        return self._outputs(obs)[0]

    def _outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Return the outputs and the mask of the rows that are not finite (None when every row is)."""
        obs = self._check(obs)
        if self._program is not None:  # the kernel checks finiteness itself, at a fraction of NumPy's cost
            out = np.empty((obs.shape[0], self.out_dim), np.float32)
            if _policy_kernels.forward(self._program_ptr, obs, out, obs.shape[0]) == 0:
                return out, None  # else it refused the batch (a row is not finite) and computed nothing
        bad = ~np.isfinite(obs).all(axis=1)
        if not bad.any():
            return self._forward(obs), None
        obs = obs.copy()
        obs[bad] = 0.0  # no kernel sees a NaN: the row's outputs are overwritten below
        out = self._forward(obs)
        out[bad] = np.nan
        return out, bad

    def _forward(self, obs: np.ndarray) -> np.ndarray:
        if self._program is not None:
            out = np.empty((obs.shape[0], self.out_dim), np.float32)
            refused = _policy_kernels.forward(self._program_ptr, obs, out, obs.shape[0])
            if refused:  # _outputs zeroes the rows that are not finite first
                raise ValueError(f"{refused} observation rows hold NaN or an infinity")
            return out
        x = obs
        for op in self.ops:
            x = op.forward(x)
        return x

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Return the actions (or outputs) for a float32 batch ``(batch, obs_dim)``; see the class docstring."""
        if (  # the common case, checked in as few steps as a batch-1 call can afford; all else below
            self._outputs_are_actions
            and type(obs) is np.ndarray
            and obs.dtype is _FLOAT32
            and obs.ndim == 2
            and obs.shape[1] == self.obs_dim
            and obs.flags.c_contiguous
        ):
            out = np.empty((obs.shape[0], self.out_dim), np.float32)
            if _policy_kernels.forward(self._program_ptr, obs, out, obs.shape[0]) == 0:
                return out
        out, bad = self._outputs(obs)
        kind = self.output.kind
        if kind == "argmax":
            actions = out.argmax(axis=1)
        elif kind == "multi_argmax":
            splits = np.split(out, np.cumsum(self.output.nvec)[:-1], axis=1)
            actions = np.stack([s.argmax(axis=1) for s in splits], axis=1)
        elif kind == "binary":
            actions = (out > 0).astype(np.int64)
        else:
            return out
        if bad is not None:
            actions[bad] = NO_ACTION
        return actions

    @property
    def weight_bytes(self) -> int:
        """Return the bytes of weights, scales, indices, DFT tables and biases one call reads."""
        return sum(op.weight_bytes() for op in self.ops)

    def describe(self) -> list[dict[str, Any]]:
        """Return one row per op: name, kernel (with its block shape or B), in, out, activation, bytes."""
        return [
            dict(
                name=op.name,
                kernel=op.describe(),
                n_in=op.n_in,
                n_out=op.n_out,
                activation=op.activation,
                weight_bytes=op.weight_bytes(),
            )
            for op in self.ops
        ]

    def __repr__(self) -> str:
        kernels = ", ".join(op.describe() for op in self.ops)
        return f"CompiledPolicy({self.obs_dim} -> {self.out_dim}, compiled={self.compiled}, ops=[{kernels}])"


def _check_options(precision: str, circulant_precision: str | None, max_sparse_density: float) -> str:
    if precision not in LAYER_PRECISIONS:
        raise ValueError(f"precision must be one of {LAYER_PRECISIONS}, got {precision!r}")
    circulant = circulant_precision or (precision if precision in PRECISIONS else "int8")
    if circulant not in PRECISIONS:
        raise ValueError(
            f"circulant_precision must be one of {tuple(PRECISIONS)}, got {circulant_precision!r}"
        )
    if not 0.0 <= max_sparse_density <= 1.0:
        raise ValueError(f"max_sparse_density must be in [0, 1], got {max_sparse_density}")
    return circulant


def compile_policy(
    policy: Any,
    precision: str = "fp32",
    *,
    circulant_precision: str | None = None,
    sparse_block: Sequence[int] | None = None,
    max_sparse_density: float = MAX_SPARSE_DENSITY,
    calibration: np.ndarray | None = None,
    use_kernels: bool | None = None,
) -> CompiledPolicy:
    """Return a :class:`CompiledPolicy` that computes ``policy``'s actions with compiled CPU kernels.

    ``policy``: an ``nn.Sequential`` (nested ones included) of ``nn.Linear`` (plain, pruned, or rlq
    block-circulant), ``nn.ReLU``, ``nn.Tanh``, ``nn.Flatten`` and ``nn.Identity``; or a Stable-Baselines3
    model or policy (A2C, PPO, DQN, TD3, DDPG, SAC with a flat Box observation space), whose action path is
    compiled with SB3's deterministic post-processing. It is read once; later changes to it are not seen.

    ``precision``: how layers that are not block-circulant are stored, ``"fp32"`` or ``"int8"`` (weights
    per output channel, inputs quantized per row on the fly; pruned layers block-sparse where their zeros
    fill blocks: ``sparse_block`` forces a ``(rows, inputs)`` block shape, ``max_sparse_density`` is the
    largest fraction of kept blocks worth it); or ``"int2"`` to ``"int7"``: dense codes of that width packed
    into a bit stream (:class:`rlq.deploy.formats.DenseLowBit`; NumPy and the exported C file run them, the
    compiled kernels do not). ``circulant_precision``: the block-circulant layers' stored DFTs, ``"fp32"``,
    ``"int8"`` or ``"int16"`` (default: ``precision``, ``"int8"`` under a low-bit ``precision``).

    ``calibration``: typical observations ``(n, obs_dim)`` of a quantized ``precision``; each feature is then
    divided by the power of two at or just above its largest magnitude there, folded into the first layer's
    weights, so that features of different ranges share the int8 input codes evenly
    (:mod:`rlq.deploy.input_scaling`; the first layer must not be block-circulant).

    ``use_kernels``: None uses the compiled kernels where built (see :data:`USE_KERNELS`); False forces the
    NumPy fallback. Where the kernels are wanted but not built (:func:`kernels_available` is False), the
    first call in a process warns with :data:`FALLBACK_WARNING` (a ``RuntimeWarning``) and runs NumPy. Unsupported layers and spaces raise a ``TypeError`` naming them. How close the result is
    to the PyTorch forward: :func:`rlq.deploy.error_bound`.
    """
    circulant = _check_options(precision, circulant_precision, max_sparse_density)
    if calibration is not None and precision == "fp32":
        raise ValueError(
            "calibration scales a quantized first layer's inputs; precision='fp32' quantizes none"
        )
    block = None if sparse_block is None else check_block(tuple(sparse_block))
    specs, output = read_policy(policy)
    ops: list[PackedOp] = []
    if calibration is not None:
        scaling, specs = fold_input_scales(specs, input_scales(calibration, specs[0].n_in))
        ops.append(scaling)
    kernels = USE_KERNELS if use_kernels is None else bool(use_kernels)
    vector = vector_blocks(kernels)
    ops += [plan_layer(spec, precision, circulant, block, max_sparse_density, vector) for spec in specs]
    if output.kind == "continuous":
        ops.append(Affine(ACTION_SCALING, output.scale, output.shift, output.low, output.high))
    if kernels and not kernels_available():
        _warn_fallback_once()
    return CompiledPolicy(ops, output, specs[0].n_in, kernels)
