"""A compiled policy as a dependency-free C99 file pair: ``policy.h`` and ``policy.c``.

:func:`write_c` takes what :func:`rlq.deploy.compile_policy` takes (an SB3 model or an ``nn.Sequential``
actor, plain, pruned or block-circulant) and writes its layers in the forms the runtime packs them in
(:mod:`rlq.deploy.formats`, :mod:`rlq.deploy.frequency`): float32 matrices, int8 codes with per-row scales
(or 2-7-bit codes packed into a bit stream), the kept blocks of a pruned layer with their block-CSR indices,
the half-complex DFTs of block-circulant B-vectors, all as ``const`` arrays, with the kernels of ``rlq/deploy/export_kernels.h`` (plain loops, no
allocation, no library call but ``tanhf``). The file exposes one function::

    void <name>_act(const float *obs, float *action);

which applies what SB3's ``predict(obs, deterministic=True)`` applies to one observation: the optional
observation normalisation of a ``VecNormalize``, the network, then the action's post-processing (a
squashing policy's output unscaled to ``[low, high]``, a Gaussian policy's mean clipped to it, the argmax of
a discrete policy written as a float). An observation holding NaN or an infinity gives an action of NaN in
every element, as :class:`rlq.deploy.runtime.CompiledPolicy` gives. ``policy.h`` states the sizes, the bytes of
the weight data and of the scratch arrays ``<name>_act`` keeps on its stack. The function is reentrant: it
holds no state.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlq.core.staging import staged_folder
from rlq.deploy.formats import Affine, DenseF32, DenseI8, DenseLowBit, PackedOp, SparseI8
from rlq.deploy.frequency import Circulant, dft_tables
from rlq.deploy.runtime import CompiledPolicy, compile_policy

KERNELS_FILE = Path(__file__).with_name("export_kernels.h")
ACTIVATIONS = {"none": "0", "relu": "RLQ_RELU", "tanh": "RLQ_TANH"}
CIRCULANT_KINDS = {
    "fp32": ("RLQ_CIRC_F32", "float"),
    "int16": ("RLQ_CIRC_I16", "int16_t"),
    "int8": ("RLQ_CIRC_I8", "int8_t"),
}
C_TYPES = {
    "float": np.float32,
    "uint8_t": np.uint8,
    "int8_t": np.int8,
    "int16_t": np.int16,
    "int32_t": np.int32,
}
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,30}")
VALUES_PER_LINE = 16


@dataclass
class CExport:
    """What :func:`write_c` wrote: the folder, the two files, and the sizes ``policy.h`` states."""

    folder: Path
    name: str
    obs_dim: int
    action_dim: int
    weight_bytes: int
    stack_bytes: int
    ops: list[dict[str, Any]] = field(default_factory=list)
    table_bytes: int = 0
    """Of ``weight_bytes``, the DFT tables block-circulant layers share (one forward and one inverse per B)."""

    @property
    def header(self) -> Path:
        return self.folder / f"{self.name}.h"

    @property
    def source(self) -> Path:
        return self.folder / f"{self.name}.c"

    @classmethod
    def read(cls, folder: str | os.PathLike, name: str | None = None) -> CExport:
        """Return what the export in ``folder`` states, read from its ``<name>.h``: sizes, and ``ops`` from
        the header's list of layers.

        ``name`` may be left out when the folder holds one ``.h`` and ``.c`` pair. A folder that holds no such
        export raises FileNotFoundError or ValueError naming it and what is missing.
        """
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"no exported policy folder at {folder}")
        if name is None:
            names = sorted(h.stem for h in folder.glob("*.h") if h.with_suffix(".c").is_file())
            if len(names) != 1:
                found = f"{len(names)} pairs ({', '.join(names)})" if names else "none"
                raise ValueError(
                    f"{folder}: an export holds one NAME.h and NAME.c pair, found {found}; pass name="
                )
            name = names[0]
        header = folder / f"{name}.h"
        if not header.is_file() or not header.with_suffix(".c").is_file():
            raise FileNotFoundError(f"{folder} holds no exported policy {name}.h and {name}.c")
        text = header.read_text(errors="replace")
        sizes = []
        for what in ("OBS_DIM", "ACTION_DIM", "WEIGHT_BYTES", "STACK_BYTES"):
            found = re.search(rf"^#define {name.upper()}_{what} (\d+)$", text, re.M)
            if found is None:
                raise ValueError(f"{header} defines no {name.upper()}_{what}: not a header rlq.deploy wrote")
            sizes.append(int(found.group(1)))
        ops = [
            dict(name=m[1], kernel=m[2], n_in=int(m[3]), n_out=int(m[4]))
            for m in re.finditer(r"^ \*   ([^:]+): (.+), (\d+) -> (\d+), \S+$", text, re.M)
        ]
        tables = re.search(rf"^#define {name.upper()}_TABLE_BYTES (\d+)$", text, re.M)
        return cls(folder, name, *sizes, ops=ops, table_bytes=int(tables.group(1)) if tables else 0)


def _c_float(v: float) -> str:
    if np.isnan(v):
        raise ValueError("a weight array holds NaN; such a policy cannot be exported")
    if np.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    text = f"{v:.9g}"
    if not any(ch in text for ch in ".e"):
        text += ".0"
    return text + "f"


class _Emitter:
    """Collects the const arrays and the op calls of one policy.c."""

    def __init__(self, name: str):
        self.name = name
        self.arrays: list[str] = []
        self.calls: list[str] = []
        self.uses: set[str] = set()
        self.weight_bytes = 0
        self.table_bytes = 0
        self.tables: dict[int, list[str]] = {}

    def array(self, key: str, values: np.ndarray, ctype: str) -> str:
        """Add ``static const ctype <name>_<key>[]`` holding ``values`` (flattened); return its C name."""
        raw = np.asarray(values).reshape(-1)
        flat = raw.astype(C_TYPES[ctype])
        if ctype != "float" and not np.array_equal(flat, raw):
            raise ValueError(f"array {key!r} does not fit {ctype}")
        nbytes = int(flat.size * flat.dtype.itemsize)
        if flat.size == 0:  # C has no empty arrays: one unread element
            flat = np.zeros(1, flat.dtype)
        if ctype == "float":
            items = [_c_float(v) for v in flat.astype(np.float64).tolist()]
        else:
            items = [str(int(v)) for v in flat.tolist()]
        lines = [", ".join(items[i : i + VALUES_PER_LINE]) for i in range(0, len(items), VALUES_PER_LINE)]
        c_name = f"{self.name}_{key}"
        body = ",\n    ".join(lines)
        self.arrays.append(f"static const {ctype} {c_name}[{len(items)}] = {{\n    {body}\n}};")
        self.weight_bytes += nbytes
        return c_name

    def optional(self, key: str, values: np.ndarray | None, ctype: str) -> str:
        return "0" if values is None else self.array(key, values, ctype)

    def dft_tables(self, block_size: int) -> list[str]:
        """Return the C names of the forward and inverse DFT tables of ``block_size``, shared by its layers."""
        if block_size not in self.tables:
            before = self.weight_bytes
            self.tables[block_size] = [
                self.array(f"{key}{block_size}", table.astype(np.float32), "float")
                for key, table in zip(("dft", "idft"), dft_tables(block_size), strict=True)
            ]
            self.table_bytes += self.weight_bytes - before
        return self.tables[block_size]


def _emit_op(e: _Emitter, i: int, op: PackedOp, x: str, y: str) -> None:
    act = ACTIVATIONS[op.activation]
    if op.activation == "tanh":
        e.uses.add("TANH")
    p = f"l{i}"
    a = op.arrays
    bias = e.optional(f"{p}_bias", a.get("bias"), "float")
    if isinstance(op, DenseF32):
        e.uses.add("DENSE_F32")
        w = e.array(f"{p}_weight", a["weight"][:, : op.n_in], "float")
        e.calls.append(f"rlq_dense_f32({op.n_in}, {op.n_out}, {w}, {bias}, {act}, {x}, {y});")
    elif isinstance(op, SparseI8):
        e.uses.update({"SPARSE_I8", "CODES"})
        w = e.array(f"{p}_codes", a["weight"], "int8_t")
        rowptr, col = e.array(f"{p}_rowptr", a["rowptr"], "int32_t"), e.array(f"{p}_col", a["col"], "int32_t")
        scale, colsum = (
            e.array(f"{p}_scale", a["scale"], "float"),
            e.array(f"{p}_colsum", a["colsum"], "int32_t"),
        )
        r, k = op.block
        e.calls.append(
            f"rlq_sparse_i8({op.n_in}, {op.n_out}, {r}, {k}, {op.block_rows}, {w}, {rowptr}, {col}, "
            f"{scale}, {colsum}, {bias}, {act}, {x}, {y}, u);"
        )
    elif isinstance(op, DenseLowBit):
        e.uses.update({"DENSE_LOWBIT", "CODES"})
        stream = e.array(f"{p}_codes{op.bits}", a["packed"], "uint8_t")
        scale, colsum = (
            e.array(f"{p}_scale", a["scale"], "float"),
            e.array(f"{p}_colsum", a["colsum"], "int32_t"),
        )
        e.calls.append(
            f"rlq_dense_lowbit({op.n_in}, {op.n_out}, {op.bits}, {stream}, {scale}, {colsum}, {bias}, {act}, "
            f"{x}, {y}, u);"
        )
    elif isinstance(op, DenseI8):
        e.uses.update({"DENSE_I8", "CODES"})
        w = e.array(f"{p}_codes", op.codes, "int8_t")
        scale, colsum = (
            e.array(f"{p}_scale", a["scale"], "float"),
            e.array(f"{p}_colsum", a["colsum"], "int32_t"),
        )
        e.calls.append(
            f"rlq_dense_i8({op.n_in}, {op.n_out}, {w}, {scale}, {colsum}, {bias}, {act}, {x}, {y}, u);"
        )
    elif isinstance(op, Circulant):
        _emit_circulant(e, p, op, bias, act, x, y)
    elif isinstance(op, Affine):
        e.uses.add("AFFINE")
        names = [e.array(f"{p}_{key}", a[key], "float") for key in ("scale", "shift", "low", "high")]
        e.calls.append(f"rlq_affine({op.n_in}, {', '.join(names)}, {act}, {x}, {y});")
    else:
        raise TypeError(f"layer {op.name!r}: no C kernel for the stored form {op.describe()!r}")


def _emit_circulant(e: _Emitter, p: str, op: Circulant, bias: str, act: str, x: str, y: str) -> None:
    e.uses.add("CIRCULANT")
    kind, ctype = CIRCULANT_KINDS[op.precision]
    values = op.values[:, : op.blocks_in]
    w = e.array(f"{p}_spectra", values.astype(np.float32) if ctype == "float" else values, ctype)
    scale = e.optional(f"{p}_scale", op.arrays.get("scale"), "float")
    colsum = "0"
    if op.precision == "int8":
        e.uses.add("CODES")
        colsum = e.array(f"{p}_colsum", op.arrays["colsum"], "int32_t")
    d, inverse = e.dft_tables(op.block_size)
    e.calls.append(
        f"rlq_circulant({op.blocks_out}, {op.blocks_in}, {op.block_size}, {kind}, {w}, {scale}, {colsum}, "
        f"{d}, {inverse}, {bias}, {act}, {x}, {y}, xf, xs, {'u' if colsum != '0' else '0'}, acc);"
    )


def _output_code(compiled: CompiledPolicy, last: str) -> tuple[list[str], int]:
    """Return the C lines that turn the network's output ``last`` into ``action``, and the action's length."""
    out = compiled.output
    n = compiled.out_dim
    if out.kind in ("values", "continuous"):
        return [f"for (i = 0; i < {n}; i++) action[i] = {last}[i];"], n
    if out.kind == "binary":
        return [f"for (i = 0; i < {n}; i++) action[i] = {last}[i] > 0.0f ? 1.0f : 0.0f;"], n
    segments = [n] if out.kind == "argmax" else list(out.nvec)
    lines, start = [], 0
    for d, width in enumerate(segments):
        lines += [
            f"best = {start};",
            f"for (i = {start + 1}; i < {start + width}; i++) if ({last}[i] > {last}[best]) best = i;",
            f"action[{d}] = (float)(best - {start});",
        ]
        start += width
    return lines, len(segments)


def _scratch(compiled: CompiledPolicy, obs_dim: int) -> dict[str, int]:
    ops = compiled.ops
    width = max([obs_dim] + [max(op.n_in, op.n_out) for op in ops])
    circ = [op for op in ops if isinstance(op, Circulant)]
    chunk = max([op.blocks_in * op.block_size for op in circ] + [1])
    codes = max(
        [op.n_in for op in ops if isinstance(op, DenseI8 | SparseI8 | DenseLowBit)]
        + [2 * chunk if circ else 1]
    )
    block = max([op.block_size for op in circ] + [1])
    return dict(width=width, chunk=chunk, codes=codes, acc=2 * block)


def render_c(
    compiled: CompiledPolicy, name: str = "policy", normalization: Affine | None = None
) -> tuple[str, str, CExport]:
    """Return the text of ``<name>.h`` and ``<name>.c`` for ``compiled``, and what they state (folder unset)."""
    if not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"the export name must be a C identifier of at most 31 characters, got {name!r}")
    ops = ([normalization] if normalization is not None else []) + list(compiled.ops)
    e = _Emitter(name)
    buffers = ("buf0", "buf1")
    source = "obs"
    for i, op in enumerate(ops):
        target = buffers[i % 2]
        _emit_op(e, i, op, source, target)
        source = target
    post, action_dim = _output_code(compiled, source)
    s = _scratch(compiled, compiled.obs_dim)
    circ = "CIRCULANT" in e.uses
    stack = 4 * 2 * s["width"] + (4 * (2 * s["chunk"] + s["acc"]) if circ else 0) + s["codes"]
    macro = name.upper()
    defines = "\n".join(f"#define RLQ_USES_{u}" for u in sorted(e.uses))
    summary = "\n".join(
        f" *   {op.name}: {op.describe()}, {op.n_in} -> {op.n_out}, {op.activation}" for op in ops
    )
    header = f"""/* {name}: a policy exported by rlq.deploy.export_c, {compiled.obs_dim} observations -> {action_dim} actions.
 *
 * Layers, in the form their weights are stored:
{summary}
 *
 * {name}_act(obs, action) reads {macro}_OBS_DIM floats and writes {macro}_ACTION_DIM floats (a discrete
 * action as its index). An observation holding NaN or an infinity gives no action: every element of
 * action is NaN, which the caller must check (isnan). It holds no state and allocates nothing; its scratch
 * arrays ({macro}_STACK_BYTES bytes) live on the stack.
 */
#ifndef {macro}_H
#define {macro}_H

#define {macro}_OBS_DIM {compiled.obs_dim}
#define {macro}_ACTION_DIM {action_dim}
#define {macro}_WEIGHT_BYTES {e.weight_bytes}
#define {macro}_TABLE_BYTES {e.table_bytes}
#define {macro}_STACK_BYTES {stack}

void {name}_act(const float *obs, float *action);

#endif
"""
    locals_ = [f"float buf0[{s['width']}], buf1[{s['width']}];", "int i;"]
    if "CODES" in e.uses:
        locals_.append(f"uint8_t u[{s['codes']}];")
    if circ:
        locals_.append(f"float xf[{s['chunk']}], xs[{s['chunk']}], acc[{s['acc']}];")
    if compiled.output.kind in ("argmax", "multi_argmax"):
        locals_.append("int best;")
    guard = [  # no action from an observation that is not finite (rlq.deploy.runtime.CompiledPolicy)
        f"for (i = 0; i < {compiled.obs_dim}; i++) {{",
        "    if (!isfinite(obs[i])) {",
        f"        for (i = 0; i < {action_dim}; i++) action[i] = NAN;",
        "        return;",
        "    }",
        "}",
    ]
    body = "\n".join(f"    {line}" for line in locals_ + guard + e.calls + post)
    c_source = f"""/* {name}: generated by rlq.deploy.export_c; see {name}.h. */
#include <math.h>
#include <stdint.h>

#include "{name}.h"

{defines}

{KERNELS_FILE.read_text()}
/* weights, scales and indices as stored: {e.weight_bytes} bytes */
{chr(10).join(e.arrays)}

void {name}_act(const float *obs, float *action) {{
{body}
}}
"""
    described = [dict(name=op.name, kernel=op.describe(), n_in=op.n_in, n_out=op.n_out) for op in ops]
    info = CExport(
        Path(),
        name,
        compiled.obs_dim,
        action_dim,
        e.weight_bytes,
        stack,
        described,
        table_bytes=e.table_bytes,
    )
    return header, c_source, info


def normalization_op(vec_normalize: Any, obs_dim: int) -> Affine:
    """Return the op applying a ``VecNormalize``'s observation statistics: ``clip((obs - mean) / std, +-c)``.

    ``std = sqrt(var + epsilon)``, as ``VecNormalize.normalize_obs`` computes it; the op multiplies by its
    float32 reciprocal.
    """
    if not getattr(vec_normalize, "norm_obs", False):
        raise ValueError("the VecNormalize does not normalise observations; export without it")
    rms = vec_normalize.obs_rms
    if isinstance(rms, dict):
        raise TypeError("a VecNormalize over a Dict observation space cannot be exported (flat Box only)")
    mean = np.asarray(rms.mean, np.float64).reshape(-1)
    std = np.sqrt(np.asarray(rms.var, np.float64).reshape(-1) + vec_normalize.epsilon)
    if mean.size != obs_dim:
        raise ValueError(
            f"the VecNormalize holds {mean.size} observation statistics, the policy takes {obs_dim}"
        )
    clip = float(vec_normalize.clip_obs)
    return Affine(
        "observation normalisation", 1.0 / std, -mean / std, np.full(obs_dim, -clip), np.full(obs_dim, clip)
    )


def network_inputs(calibration: np.ndarray | None, vec_normalize: Any) -> np.ndarray | None:
    """Return ``calibration`` observations as the network sees them: normalised by ``vec_normalize`` if given."""
    if calibration is None or vec_normalize is None:
        return calibration
    x = np.asarray(calibration, np.float32)
    if x.ndim != 2:
        raise ValueError(f"calibration must be observations of shape (n, obs_dim), got shape {x.shape}")
    return normalization_op(vec_normalize, x.shape[1]).forward(x)


def write_c(
    policy: Any,
    out: str | os.PathLike,
    *,
    name: str = "policy",
    precision: str = "fp32",
    circulant_precision: str | None = None,
    sparse_block: tuple[int, int] | None = None,
    vec_normalize: Any = None,
    calibration: np.ndarray | None = None,
) -> CExport:
    """Write ``<name>.h`` and ``<name>.c`` of ``policy`` into the new folder ``out``; return what they state.

    ``policy``: what :func:`rlq.deploy.compile_policy` takes, or a :class:`CompiledPolicy`; ``precision``
    and ``circulant_precision`` as there (int8 stores codes and per-row scales, ``"int2"`` to ``"int7"`` such
    codes packed into a bit stream, ``bits`` per weight; block-circulant layers keep their DFTs at
    ``circulant_precision``; ``sparse_block`` forces the block shape of pruned layers). ``vec_normalize``: a
    ``VecNormalize`` whose observation normalisation the C function applies first. ``calibration``: typical
    observations (as the C function receives them) for the first layer's input scaling at a quantized
    ``precision`` (see :func:`rlq.deploy.compile_policy`). ``out`` must not exist: the folder appears whole or
    not at all, and an unsupported layer or space raises before anything is written.
    """
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; export into a new folder")
    if isinstance(policy, CompiledPolicy):
        if calibration is not None:
            raise ValueError(
                "a CompiledPolicy is compiled already: pass calibration to compile_policy instead"
            )
        compiled = policy
    else:
        compiled = compile_policy(
            policy,
            precision,
            circulant_precision=circulant_precision,
            sparse_block=sparse_block,
            calibration=network_inputs(calibration, vec_normalize),
            use_kernels=False,
        )
    normalization = None if vec_normalize is None else normalization_op(vec_normalize, compiled.obs_dim)
    header, source, info = render_c(compiled, name, normalization)
    with staged_folder(out) as staging:
        (staging / f"{name}.h").write_text(header)
        (staging / f"{name}.c").write_text(source)
    info.folder = out
    return info
