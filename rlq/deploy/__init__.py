"""rlq.deploy: a CPU runtime for compressed policies, each layer computed in the form it is stored in.

:func:`compile_policy` reads an ``nn.Sequential`` actor or a Stable-Baselines3 model's action path once and
returns a :class:`CompiledPolicy`, a callable from a float32 ``(batch, obs_dim)`` array to SB3's actions:
block-circulant layers in the frequency domain, pruned layers block-sparse int8, other layers dense int8 or
float32, all in one call to compiled C kernels (a NumPy fallback computes the same where they are not
built). Given calibration observations, an int8 policy first divides each observation feature by a power of
two folded into its first layer, so that features of different ranges share the input codes
(:mod:`rlq.deploy.input_scaling`).

How close it is to the PyTorch forward of the same module: with float32 storage (``precision="fp32"``
and float32 DFTs) within :data:`FP32_RTOL` of the largest output magnitude; with int8 or int16 storage
within :func:`error_bound`, a worst-case bound on the quantization of weights and inputs carried through
the absolute weights, plus a float32 allowance. Being a worst case it is loose: on random 64-256 wide MLPs
(int8, B = 16) the median entry's error is 300 to 1,700 times smaller than it.

:func:`export_policy` (the ``rlq export`` command) writes the same layers out of Python: a C99 file pair
with the same stored forms and arithmetic (:func:`write_c`; :func:`load_c_policy` builds and calls it
here), or an ONNX model for stock ONNX Runtime; :func:`check_export` runs what it wrote on given observations
against the policy. See docs/deploy.md.
"""

from rlq.deploy.bounds import FP32_RTOL, SAME_CODES_RTOL, error_bound, parity
from rlq.deploy.c_build import load_c_policy
from rlq.deploy.check import ExportCheck, check_export
from rlq.deploy.export import export_policy
from rlq.deploy.export_c import write_c
from rlq.deploy.runtime import CompiledPolicy, compile_policy, kernels_available

__all__ = [
    "compile_policy",
    "CompiledPolicy",
    "error_bound",
    "FP32_RTOL",
    "SAME_CODES_RTOL",
    "parity",
    "kernels_available",
    "export_policy",
    "write_c",
    "load_c_policy",
    "check_export",
    "ExportCheck",
]
"""What a user calls; the stored forms live in :mod:`rlq.deploy.formats` and :mod:`rlq.deploy.frequency`."""
