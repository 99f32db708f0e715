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
    flags = _cpu_flags()
    return flags is None or not flags & {"avx512_vnni", "avx_vnni"}


def _cpuinfo_lines() -> list[str] | None:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None


def _cpu_flags() -> set[str] | None:
    """Return the first processor's flags (x86 ``flags``, Arm ``Features``), or None where /proc/cpuinfo is unreadable."""
    lines = _cpuinfo_lines()
    if lines is None:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def vector_extensions() -> list[str]:
    """Return the vector extensions that decide this CPU's int8 and fp32 kernel speed: the widest of AVX-512,
    AVX2 and NEON, then VNNI where it has it (its int8 dot products), e.g. ``["AVX-512", "VNNI"]``; [] where
    /proc/cpuinfo tells none. Two CPUs of one model name may differ here (cloud machines of one family)."""
    flags = _cpu_flags() or set()
    widths = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("asimd", "NEON"))
    widest = next((name for flag, name in widths if flag in flags), None)
    vnni = "VNNI" if flags & {"avx512_vnni", "avx_vnni"} else None
    return [name for name in (widest, vnni) if name]


def cpu_name() -> str:
    """Return the CPU's model name from /proc/cpuinfo, e.g. ``AMD EPYC`` ("unknown" where there is none)."""
    lines = _cpuinfo_lines() or []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")


def cpu_model() -> str:
    """Return :func:`cpu_name` with the CPU's :func:`vector_extensions`, e.g. ``AMD EPYC (AVX-512, VNNI)``: what a
    speed figure belongs to."""
    extensions = vector_extensions()
    return f"{cpu_name()} ({', '.join(extensions)})" if extensions else cpu_name()
