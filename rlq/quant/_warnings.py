"""Silence the deprecation chatter of ``torch.ao.quantization`` and the legacy ONNX exporter, locally."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_deprecations() -> Iterator[None]:
    """Yield with torch.ao's and the ONNX exporter's deprecation and observer warnings ignored."""
    # torch.ao.quantization still works in torch 2.13 but warns on every call that it will move to torchao;
    # the warnings say nothing a caller of rlq can act on.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.ao\.")
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx\.")
        warnings.filterwarnings("ignore", category=UserWarning, message=r".*TypedStorage.*")
        yield
