"""What rlq's optional compiled kernels share: whether they are switched on, and which tensors they may read.

The kernels (``rlq/compress/_circulant_kernels.c``, ``rlq/quant/_fake_quant_kernels.c``, built by
``setup.py``) take raw data pointers, so they may only be handed plain, contiguous float32 tensors in CPU
memory; every caller checks :func:`kernel_readable` before passing ``data_ptr()``.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor


def kernels_switched_on(env_var: str) -> bool:
    """Return False when the environment variable ``env_var`` is ``"0"`` (kernels off for comparison), else True."""
    return os.environ.get(env_var, "1") != "0"


def kernel_readable(x: Tensor) -> bool:
    """Return whether a compiled kernel may read ``x`` through its data pointer: plain, contiguous, float32, CPU."""
    return (
        type(x) in (Tensor, torch.nn.Parameter)
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and x.is_contiguous()
    )
