"""A safe removal of ``torch.nn.utils.parametrize`` parametrizations, shared by ``rlq.compress`` and ``rlq.quant``."""

from __future__ import annotations

from torch import nn
from torch.nn.utils import parametrize


def remove_parametrizations_(
    layer: nn.Module, tensor_name: str, leave_parametrized: bool = True
) -> nn.Module:
    """Return ``layer`` after ``parametrize.remove_parametrizations``, without touching any copy of it.

    ``copy.deepcopy`` of a parametrized module shares the class torch created for it (``ParametrizedLinear``),
    which holds the parametrized tensor as a property; removing the parametrization from one copy deletes
    that property from the shared class and breaks every other copy (``'ParametrizedLinear' object has no
    attribute 'weight'``). The layer first gets a class of its own, so the removal stays local.
    """
    cls = layer.__class__
    namespace = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
    layer.__class__ = type(cls.__name__, cls.__bases__, namespace)
    parametrize.remove_parametrizations(layer, tensor_name, leave_parametrized=leave_parametrized)
    return layer
