"""Stable-Baselines3 adapters: put rlq's compression and quantization into any SB3 training.

    from rlq.sb3 import GSTCallback, GradualPruningCallback, QATCallback

Submodules are imported on demand:

- ``rlq.sb3.networks``: the anatomy of an SB3 policy: its layers per network, which the callbacks compress,
  their target twins, and the optimizers training them.
- ``rlq.sb3.compression``: ``CompressionCallback``, what every compression callback shares (and the dense
  baseline's recorder); ``rlq.sb3.compression_history``: the rows it records; ``rlq.sb3.policy_sync``: the
  target networks and optimizers kept in step with the online networks' compression.
- ``rlq.sb3.gst_callback``: ``GSTCallback``; ``rlq.sb3.pruning_callback``: ``GradualPruningCallback`` (the iterative-pruning baseline).
- ``rlq.sb3.checkpoint``: saving and loading compressed models, schedule state included.
- ``rlq.sb3.qat_callback``: ``QATCallback``, quantization-aware training that provably quantizes;
  ``rlq.sb3.qat_policy``: which layers of a policy QAT quantizes, preparation and conversion;
  ``rlq.sb3.qat_stacking``: QAT's quantizers on top of a compressed layer.
- ``rlq.sb3.quantized``: any SB3 model evaluated at any precision (fp16, int8, simulated int2..int16).
- ``rlq.sb3.action_path``: the network from observation to action of any SB3 policy, and its observation
  preprocessing (what ``quantized`` quantizes and exports).
"""

from typing import Any

_EXPORTS = {
    "CompressionCallback": "rlq.sb3.compression",
    "GSTCallback": "rlq.sb3.gst_callback",
    "GradualPruningCallback": "rlq.sb3.pruning_callback",
    "QATCallback": "rlq.sb3.qat_callback",
    "load_compressed": "rlq.sb3.checkpoint",
    "save_compressed": "rlq.sb3.checkpoint",
}
"""The callbacks and checkpoint functions a user calls, importable from ``rlq.sb3`` (loaded on first use)."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rlq.sb3' has no attribute {name!r}")
