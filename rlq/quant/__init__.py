"""Quantization of any ``nn.Module``: fake quantization, PTQ, QAT, int8 ONNX export and measurement.

Pure PyTorch (plus ONNX / ONNX Runtime for the fast int8 CPU path); no RL library is imported here. The
Stable-Baselines3 callbacks that schedule QAT during training live in ``rlq.sb3``.

- :func:`quantize_tensor`: uniform fake quantization of a tensor (the rule is in ``rlq.quant.tensor``).
- :func:`ptq`: a post-training-quantized copy at fp16, bf16, int8 (real kernels) or simulated int2..int16
  (``sim8``: the simulated, weights-only 8-bit point).
- :func:`perturb_weights`: the matched noise control, weights plus uniform noise of half a quantization step.
- :func:`prepare_qat_`, :func:`set_qat_enabled`, :func:`is_qat`, :func:`convert_qat_`: QAT with an STE.
- :func:`export_onnx`, :class:`OnnxPolicy`: fp32 / int8 ONNX models run with ONNX Runtime.
- :func:`measure_latency`, :func:`measure_interleaved` (side by side), :func:`compare_backends`, :func:`fastest_backend`: choosing by measurement.
- :func:`model_size_bytes`, :func:`relative_change`, :func:`pack_state_dict`: sizes for reporting and sending.
- :func:`bits_per_weight`, :func:`size_report`: weight storage in bits as an export stores it (values at
  their width, sparse indices, scales), per layer and overall; :func:`save_packed` / :func:`load_packed`
  write exactly that to a file and read it back as dense weights.
"""

from rlq.quant.activations import ActivationQuantizer
from rlq.quant.bits import bits_per_weight, size_report
from rlq.quant.latency import (
    BACKENDS,
    compare_backends,
    fastest_backend,
    measure_interleaved,
    measure_latency,
)
from rlq.quant.noise import perturb_weights, quantization_step
from rlq.quant.onnx_backend import OnnxPolicy, export_onnx
from rlq.quant.ptq import CastPrecision, LayerHolder, ptq
from rlq.quant.qat import WeightFakeQuant, convert_qat_, is_qat, prepare_qat_, set_qat_enabled
from rlq.quant.quantizable import quantizable_layers
from rlq.quant.size import (
    load_packed,
    model_size_bytes,
    pack_state_dict,
    relative_change,
    save_packed,
    unpack_state_dict,
)
from rlq.quant.tensor import Precision, parse_precision, quantize_tensor

__all__ = [
    "BACKENDS",
    "ActivationQuantizer",
    "CastPrecision",
    "LayerHolder",
    "OnnxPolicy",
    "Precision",
    "WeightFakeQuant",
    "bits_per_weight",
    "compare_backends",
    "convert_qat_",
    "export_onnx",
    "fastest_backend",
    "is_qat",
    "load_packed",
    "measure_interleaved",
    "measure_latency",
    "model_size_bytes",
    "pack_state_dict",
    "parse_precision",
    "perturb_weights",
    "prepare_qat_",
    "ptq",
    "quantizable_layers",
    "quantization_step",
    "quantize_tensor",
    "relative_change",
    "save_packed",
    "set_qat_enabled",
    "size_report",
    "unpack_state_dict",
]
