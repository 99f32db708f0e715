"""rlq.core.cpu: which CPUs get 7-bit int8 weights in ONNX Runtime (x86 without VNNI saturates int8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlq.core import cpu


@pytest.mark.parametrize(
    ("machine", "flags", "expected"),
    [
        ("x86_64", "fpu sse avx2 fma", True),
        ("x86_64", "fpu avx2 avx512f avx512_vnni", False),
        ("AMD64", "fpu avx2 avx_vnni", False),
        ("aarch64", "fp asimd", False),
        ("x86_64", None, True),  # flags unreadable: assume no VNNI (7 bits never saturate)
    ],
)
def test_int8_needs_reduced_range(monkeypatch, tmp_path, machine, flags, expected):
    monkeypatch.setattr(cpu.platform, "machine", lambda: machine)
    info = tmp_path / "cpuinfo"
    if flags is not None:
        info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    original = Path

    def fake_path(arg, *rest):
        return info if arg == "/proc/cpuinfo" else original(arg, *rest)

    monkeypatch.setattr(cpu, "Path", fake_path)
    assert cpu.int8_needs_reduced_range() is expected


@pytest.mark.parametrize(
    ("info", "extensions", "model"),
    [
        ("model name\t: AMD EPYC\nflags\t\t: fpu avx2 fma avx512f avx512_vnni\n", ["AVX-512", "VNNI"],
         "AMD EPYC (AVX-512, VNNI)"),
        ("model name\t: AMD EPYC\nflags\t\t: fpu sse avx2 fma\n", ["AVX2"], "AMD EPYC (AVX2)"),
        ("model name\t: Intel Xeon\nflags\t\t: avx2 avx_vnni\n", ["AVX2", "VNNI"], "Intel Xeon (AVX2, VNNI)"),
        ("processor\t: 0\nFeatures\t: fp asimd\n", ["NEON"], "unknown (NEON)"),
        ("model name\t: Old CPU\nflags\t\t: fpu sse2\n", [], "Old CPU"),
        (None, [], "unknown"),
    ],
)  # fmt: skip
def test_cpu_model_names_the_vector_extensions_that_decide_kernel_speed(
    monkeypatch, tmp_path, info, extensions, model
):
    path = tmp_path / "cpuinfo"
    if info is not None:
        path.write_text(info)
    original = Path
    monkeypatch.setattr(
        cpu, "Path", lambda arg, *rest: path if arg == "/proc/cpuinfo" else original(arg, *rest)
    )
    assert cpu.vector_extensions() == extensions
    assert cpu.cpu_model() == model
