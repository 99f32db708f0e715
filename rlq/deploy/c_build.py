"""Build an exported policy's C file for this machine and call it from Python (ctypes).

:func:`load_c_policy` compiles ``<name>.c`` with the system C compiler into a shared library in a
temporary folder (removed once the library is loaded), with the flags a strict build of the file must pass (:data:`STRICT_FLAGS`), and returns a
:class:`CPolicy`: a callable from a float32 ``(batch, obs_dim)`` array to the ``(batch, action_dim)``
actions ``<name>_act`` writes, one observation per call.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from rlq.deploy.export_c import CExport

STRICT_FLAGS = ("-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic")
"""Warnings an exported file compiles without, for the host and for ``arm-none-eabi``."""


def c_compiler() -> str | None:
    """Return the system C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang`` on the PATH), or None."""
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def compile_c(sources: list[Path], output: Path, flags: tuple[str, ...] = ()) -> Path:
    """Compile ``sources`` with :func:`c_compiler` and :data:`STRICT_FLAGS` plus ``flags`` into ``output``.

    Raises RuntimeError with the compiler's first error line when the build fails, or when there is no
    compiler.
    """
    cc = c_compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC, or install gcc)")
    cmd = [cc, *STRICT_FLAGS, "-O2", *flags, *map(str, sources), "-o", str(output), "-lm"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines()
        raise RuntimeError(f"{cc} failed on {sources[0]}: {lines[0] if lines else 'no output'}")
    return output


class CPolicy:
    """An exported policy compiled for this machine, called through ctypes (see the module docstring)."""

    def __init__(self, export: CExport, library: Path):
        self.export = export
        self._lib = ctypes.CDLL(str(library))
        self._act = getattr(self._lib, f"{export.name}_act")
        self._act.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self._act.restype = None

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Return the float32 actions ``(batch, action_dim)`` for a float32 batch ``(batch, obs_dim)``.

        Observations of another dtype raise TypeError, as :class:`rlq.deploy.runtime.CompiledPolicy` does: the C
        function reads float32, and a silent cast would round float64 inputs. A row holding NaN or an infinity
        gives NaN in every element of its action (the C function's contract, see ``<name>.h``).
        """
        if not isinstance(obs, np.ndarray):
            raise TypeError(f"a C policy takes a numpy float32 array, got {type(obs).__name__}")
        if obs.dtype != np.float32:
            raise TypeError(f"a C policy takes float32 observations, got dtype {obs.dtype}")
        obs = np.ascontiguousarray(obs)
        if obs.ndim != 2 or obs.shape[1] != self.export.obs_dim:
            raise ValueError(
                f"expected observations of shape (batch, {self.export.obs_dim}), got {obs.shape}"
            )
        out = np.empty((obs.shape[0], self.export.action_dim), np.float32)
        row_in, row_out = obs.strides[0], out.strides[0]
        base_in, base_out = obs.ctypes.data, out.ctypes.data
        for i in range(obs.shape[0]):
            self._act(base_in + i * row_in, base_out + i * row_out)
        return out


def load_c_policy(
    export: CExport | str | os.PathLike, flags: tuple[str, ...] = (), name: str | None = None
) -> CPolicy:
    """Return :class:`CPolicy` of ``export``, compiled as a shared library (``-O2 -fPIC`` plus ``flags``).

    ``export``: what :func:`rlq.deploy.write_c` returned, or the folder it wrote (``name``: the files' prefix,
    needed only when the folder holds several exports; :meth:`CExport.read`).
    """
    if not isinstance(export, CExport):
        if not isinstance(export, (str, os.PathLike)):
            raise TypeError(
                f"load_c_policy takes a CExport or an export's folder, got {type(export).__name__}"
            )
        export = CExport.read(export, name)
    with tempfile.TemporaryDirectory(prefix="rlq-c-") as build:
        library = Path(build) / f"lib{export.name}.so"
        compile_c([export.source], library, ("-shared", "-fPIC", f"-I{export.folder}", *flags))
        return CPolicy(export, library)  # loaded: the mapping outlives the file
