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
