"""Export a policy to ONNX (fp32 or int8) and run it with ONNX Runtime: the fast CPU inference path.

On small CPUs ONNX Runtime's int8 kernels beat PyTorch's by far at batch 1 (see the benchmark in
``benchmarks/bench_quant_latency.py``): this is how ActorQ-style actors act with int8 policies.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from rlq.core.cpu import int8_needs_reduced_range
from rlq.core.validation import check_positive_int
from rlq.quant._warnings import quiet_deprecations
from rlq.quant.ptq import Calibration, calibration_batches
from rlq.quant.quantizable import check_finite_weights

log = logging.getLogger(__name__)

ONNX_PRECISIONS = ("fp32", "int8")
DEFAULT_OPSET = 17


def _flatten_outputs(out: Any) -> list[Tensor]:
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and all(isinstance(o, Tensor) for o in out):
        return list(out)
    raise TypeError(
        f"ONNX export needs a module returning a tensor or a tuple of tensors, got {type(out).__name__}"
    )


def _export_fp32(module: nn.Module, path: Path, example: Tensor, opset: int) -> None:
    with torch.no_grad():
        n_outputs = len(_flatten_outputs(module(example)))
    output_names = ["output"] if n_outputs == 1 else [f"output_{i}" for i in range(n_outputs)]
    dynamic_axes = {name: {0: "batch"} for name in ["input", *output_names]}
    with quiet_deprecations():
        # The TorchScript-based exporter (dynamo=False) needs no onnxscript and works offline on torch 2.13;
        # the default dynamo exporter requires the onnxscript package.
        torch.onnx.export(
            module,
            (example,),
            str(path),
            dynamo=False,
            input_names=["input"],
            output_names=output_names,
            dynamic_axes=dynamic_axes,
            opset_version=opset,
        )


def _op_types(path: Path) -> set[str]:
    import onnx

    return {node.op_type for node in onnx.load(str(path)).graph.node}


def _quantize_int8(fp32_path: Path, out_path: Path, batches: list[Tensor], workdir: Path) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    ops = _op_types(fp32_path)
    if "Conv" in ops and not batches:
        raise ValueError(
            "int8 export of a model with convolutions needs calibration data (static quantization; ONNX Runtime's "
            "dynamic ConvInteger is slower than fp32): pass calibration=<a batch of typical inputs>"
        )
    if not ops & {"Conv", "Gemm", "MatMul"}:
        raise ValueError("the exported graph has no Conv, Gemm or MatMul node to quantize to int8")
    pre_path = workdir / "preprocessed.onnx"
    # Shape inference and graph optimisation first, as ONNX Runtime recommends (and warns about otherwise).
    quant_pre_process(str(fp32_path), str(pre_path))
    if batches:

        class BatchReader(CalibrationDataReader):
            """Hand ONNX Runtime the calibration batches, one at a time."""

            def __init__(self) -> None:
                self._batches = iter(batches)

            def get_next(self) -> dict[str, np.ndarray] | None:
                batch = next(self._batches, None)
                return None if batch is None else {"input": batch.detach().cpu().float().numpy()}

        reader = BatchReader()
        quantize_static(
            str(pre_path),
            str(out_path),
            reader,
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            reduce_range=int8_needs_reduced_range(),
            weight_type=QuantType.QInt8,
            activation_type=QuantType.QUInt8,
        )
    else:
        # Signed int8 weights (MatMulInteger U8S8) measured faster than uint8 weights on this x86 CPU.
        quantize_dynamic(
            str(pre_path),
            str(out_path),
            weight_type=QuantType.QInt8,
            reduce_range=int8_needs_reduced_range(),
            op_types_to_quantize=["MatMul", "Gemm"],
        )


def export_onnx(
    module: nn.Module,
    path: str | os.PathLike,
    example_input: Tensor | np.ndarray,
    precision: str = "fp32",
    *,
    calibration: Calibration | None = None,
    overwrite: bool = False,
    opset: int = DEFAULT_OPSET,
) -> Path:
    """Return the path of the ONNX model of ``module`` written at ``precision`` (``"fp32"`` or ``"int8"``).

    The model has one input, ``input``, and one output per output tensor (``output``, or ``output_0``, ...),
    all with a dynamic batch dimension. ``module`` must be a float32 module taking one tensor;
    ``example_input`` is one such batch. ``"int8"`` quantizes the exported graph with ONNX Runtime: static
    (QDQ, per-channel int8 weights, uint8 activations calibrated on ``calibration``) when calibration data is
    given, which a model with convolutions needs; otherwise dynamic quantization of its MatMul/Gemm nodes
    (int8 weights, activations quantized per batch). An existing file is replaced only with ``overwrite``;
    the file appears whole or not at all. At ``"int8"`` a Linear / convolution weight holding NaN or inf raises
    a ``ValueError`` naming the layer (ONNX Runtime would fail on it with a bare assertion, or quantize it
    into garbage); ``"fp32"`` exports such a weight as it is.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(module).__name__}")
    if precision not in ONNX_PRECISIONS:
        raise ValueError(f"unknown ONNX precision {precision!r}; choose one of {', '.join(ONNX_PRECISIONS)}")
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory")
    example = torch.as_tensor(example_input)
    batches = calibration_batches(calibration)
    if precision == "int8":
        check_finite_weights(module, precision)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rlq-onnx-") as tmp:
        workdir = Path(tmp)
        fp32_path = workdir / "fp32.onnx"
        _export_fp32(module, fp32_path, example.float(), opset)
        if precision == "fp32":
            result = fp32_path
        else:
            result = workdir / "int8.onnx"
            _quantize_int8(fp32_path, result, batches, workdir)
        staged = path.with_name(f".{path.name}.tmp")
        shutil.copyfile(result, staged)
        os.replace(staged, path)
    log.debug("exported %s ONNX model to %s", precision, path)
    return path


class OnnxPolicy:
    """Run an ONNX model with ONNX Runtime on CPU, taking and returning NumPy arrays or torch tensors.

    Called on a torch tensor it returns torch tensors, on anything else NumPy arrays: one output alone, several
    as a tuple, like the exported module. ``threads`` sets ONNX Runtime's intra-op threads (ActorQ's actors
    use one each).
    """

    def __init__(self, path: str | os.PathLike, threads: int = 1):
        import onnxruntime as ort

        check_positive_int("threads", threads)
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no ONNX model at {self.path}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # errors only: no optimizer notes on stderr
        self.threads = threads
        self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        inputs = self.session.get_inputs()
        if len(inputs) != 1:
            raise ValueError(f"OnnxPolicy runs models with one input; {self.path} has {len(inputs)}")
        self.input_name = inputs[0].name
        self.output_names: list[str] = [o.name for o in self.session.get_outputs()]

    def run(self, x: np.ndarray) -> list[np.ndarray]:
        """Return every output of the model for the float32 array ``x``."""
        return self.session.run(self.output_names, {self.input_name: x})

    def __call__(self, x: Tensor | np.ndarray | Sequence[float]) -> Any:
        is_torch = isinstance(x, Tensor)
        array = x.detach().cpu().numpy() if is_torch else np.asarray(x)
        outputs = self.run(np.ascontiguousarray(array, dtype=np.float32))
        if is_torch:
            outputs = [torch.from_numpy(o) for o in outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def __repr__(self) -> str:
        return f"OnnxPolicy({str(self.path)!r}, threads={self.threads})"
