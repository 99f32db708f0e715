"""Build of rlq's three compiled modules; everything else is in pyproject.toml.

Plain C, no PyTorch headers: ``rlq.compress._circulant_kernels`` (the block-circulant expansion and its
gradient), ``rlq.quant._fake_quant_kernels`` (QAT's symmetric fake quantization) and
``rlq.deploy._policy_kernels`` (compiled policies' batch-1 inference). All are optional: where they cannot
be compiled rlq installs without them, and :mod:`rlq.compress.circulant`, :mod:`rlq.quant.tensor` and
:mod:`rlq.deploy.runtime` fall back to PyTorch or NumPy ops (the first two with the same results, the
third within the tolerance it documents).
"""

from setuptools import Extension, setup

# exact IEEE arithmetic: the kernels reproduce PyTorch's results bit for bit (no fused multiply-add, no fast math)
FLAGS = ["-O3", "-std=c99", "-ffp-contract=off", "-fno-fast-math"]
# inference kernels for the machine they are built on: its vector units (AVX-512, VNNI) and fused multiply-adds;
# no fast math (their sums run in a fixed lane order, which needs no reassociation to vectorise)
DEPLOY_FLAGS = ["-O3", "-std=c99", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-Wno-psabi"]

setup(
    ext_modules=[
        Extension(name, [source], extra_compile_args=flags, optional=True)
        for name, source, flags in [
            ("rlq.compress._circulant_kernels", "rlq/compress/_circulant_kernels.c", FLAGS),
            ("rlq.quant._fake_quant_kernels", "rlq/quant/_fake_quant_kernels.c", FLAGS),
            ("rlq.deploy._policy_kernels", "rlq/deploy/_policy_kernels.c", DEPLOY_FLAGS),
        ]
    ]
)
