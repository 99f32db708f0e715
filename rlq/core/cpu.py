"""Facts about this CPU: its model name, and what changes how int8 inference must be set up (no torch, no
ONNX imported)."""

from __future__ import annotations

import platform
from pathlib import Path


def int8_needs_reduced_range() -> bool:
    """Return True on x86 CPUs without VNNI, where ONNX Runtime's int8 kernels need 7-bit weights.

    Without VNNI, ONNX Runtime multiplies uint8 activations by int8 weights with ``vpmaddubsw``, whose
    int16 pair sums saturate. On an AVX2-only AMD EPYC, full-range int8 weights put a 5-128-128-3 MLP's
    outputs off by up to 0.029 (width 32: 0.011); with ``reduce_range`` (7-bit weights) by 0.0025 (measured
    2026-11-30 with ONNX Runtime 1.31.1 and 1.32.0, the same on both). With VNNI (``avx512_vnni``/``avx_vnni``) and on other
    architectures the full int8 range is exact. Where the flags cannot be read, x86 is assumed to lack VNNI.
    """
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    return not any(flag in flags.split() for flag in ("avx512_vnni", "avx_vnni"))


def cpu_model() -> str:
    """Return the CPU's model name from /proc/cpuinfo ("unknown" where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")
