"""Build of rlq's two compiled modules; everything else is in pyproject.toml.

Plain C, no PyTorch headers: ``rlq.compress._circulant_kernels`` (the block-circulant expansion and its
gradient) and ``rlq.quant._fake_quant_kernels`` (QAT's symmetric fake quantization). Both are optional:
where they cannot be compiled rlq installs without them, and :mod:`rlq.compress.circulant` and
:mod:`rlq.quant.tensor` fall back to PyTorch ops with the same results.
"""

from setuptools import Extension, setup

# exact IEEE arithmetic: the kernels reproduce PyTorch's results bit for bit (no fused multiply-add, no fast math)
FLAGS = ["-O3", "-std=c99", "-ffp-contract=off", "-fno-fast-math"]

setup(
    ext_modules=[
        Extension(name, [source], extra_compile_args=FLAGS, optional=True)
        for name, source in [
            ("rlq.compress._circulant_kernels", "rlq/compress/_circulant_kernels.c"),
            ("rlq.quant._fake_quant_kernels", "rlq/quant/_fake_quant_kernels.c"),
        ]
    ]
)
