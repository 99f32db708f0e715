"""Post-training quantization (PTQ) of any ``nn.Module``: a quantized copy at fp16, bf16, int8 or intN.

QuaRL (Krishnan et al., arXiv 1910.01055, section 4.1) quantizes a trained policy after training and rolls
it out: fp16 as a cast, int8 and lower as uniform quantization of the weights (per tensor for linear layers,
per output channel for convolutions).

Why ``torch.ao.quantization`` and not torchao, although the former warns that it is deprecated in favour of
the latter: torchao 0.18 works on this CPU (outputs within 2e-3 of fp32, like ``torch.ao``'s) but is slower
than ``torch.ao`` at every size measured. ``benchmarks/bench_torchao.py``, one thread, two runs on a quiet
machine (load 1.0, 2026-12-01), torchao's latency over ``torch.ao``'s dynamic int8 in the same run:

- TD3 actor 17-256-256-6, batch 1: ``Int8DynamicActivationInt8WeightConfig`` 6.7x slower, ``Int8WeightOnlyConfig``
  1.02-1.04x; batch 256: 4.2-4.6x and 1.7x.
- ActorQ's 24-2048x3-6 policy, batch 1: 3.1x and 6.2-6.7x; batch 256: 1.07-1.10x and 3.5-4.8x.

So the int8 path stays on ``torch.ao`` (and ONNX Runtime, :mod:`rlq.quant.onnx_backend`) until torchao's CPU
kernels catch up; the benchmark says when.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from rlq.quant._warnings import quiet_deprecations
from rlq.quant.activations import attach_input_quantizers
from rlq.quant.quantizable import (
    bake_parametrizations,
    check_finite_weights,
    has_convolutions,
    is_quantizable,
    output_channel_axis,
    quantizable_layers,
    weight_name,
)
from rlq.quant.tensor import Precision, parse_precision, quantize_tensor

Calibration = Tensor | np.ndarray | Iterable[Tensor | np.ndarray]


class CastPrecision(nn.Module):
    """Run ``module`` in a lower float ``dtype`` while taking and returning float32 tensors."""

    def __init__(self, module: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.module = module
        self.dtype = dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.module(*_cast_floats(args, self.dtype), **_cast_floats(kwargs, self.dtype))
        return _cast_floats(out, torch.float32)

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}"


class LayerHolder(nn.Module):
    """Hold a bare layer as a child, so that quantization by module swapping can replace it."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.layer(*args, **kwargs)


def _cast_floats(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_cast_floats(v, dtype) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_cast_floats(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast_floats(v, dtype) for k, v in value.items()}
    return value


def calibration_batches(calibration: Calibration | None) -> list[Tensor]:
    """Return ``calibration`` (one batch, or an iterable of batches) as a list of float32 tensors."""
    if calibration is None:
        return []
    if isinstance(calibration, (Tensor, np.ndarray)):
        calibration = [calibration]
    batches = []
    for batch in calibration:
        if not isinstance(batch, (Tensor, np.ndarray)):
            raise TypeError(f"calibration batches must be tensors or arrays, got {type(batch).__name__}")
        batches.append(torch.as_tensor(batch).to(torch.float32))
    if not batches:
        raise ValueError("calibration holds no batch")
    return batches


def detach_pruned_weights_(module: nn.Module) -> nn.Module:
    """Return ``module`` with each ``torch.nn.utils.prune`` weight recomputed without grad (its value unchanged).

    The pruning hook sets ``weight = weight_orig * weight_mask`` at every forward; after a forward with grad
    that tensor is not a graph leaf and ``copy.deepcopy`` refuses it. The hook recomputes it at the next
    forward, so replacing it by the same values without grad changes nothing the module computes.
    """
    from torch.nn.utils import prune

    for layer in module.modules():
        for hook in layer._forward_pre_hooks.values():
            if isinstance(hook, prune.BasePruningMethod):
                with torch.no_grad():
                    setattr(layer, hook._tensor_name, hook.apply_mask(layer))
    return module


def _check_module(module: nn.Module) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(module).__name__}")


def ptq(
    module: nn.Module,
    precision: str | Precision,
    calibration: Calibration | None = None,
    activations: bool = False,
    *,
    per_channel_linear: bool = False,
) -> nn.Module:
    """Return a post-training-quantized copy of ``module`` in eval mode; ``module`` itself is left untouched.

    ``precision``:

    - ``"fp32"``: a plain copy.
    - ``"fp16"`` / ``"bf16"``: the copy cast to that type inside :class:`CastPrecision`, so it still takes and
      returns float32 tensors.
    - ``"int8"``: real integer kernels from ``torch.ao`` on the current quantized engine (x86 / fbgemm here).
      A model without convolutions gets dynamic quantization of its ``nn.Linear`` layers (int8 weights,
      activations quantized per batch at run time).
      A model with convolutions, or any model when ``activations`` is true, gets static quantization with
      activation ranges calibrated on ``calibration`` (required then): FX graph mode with conv-ReLU fusion,
      falling back to eager mode (``QuantWrapper``) when the model cannot be traced symbolically. The
      model's input itself is quantized over each batch's own range at run time
      (``torch.quantize_per_tensor_dynamic``, :func:`quantize_inputs_per_batch_`), not clipped to the range
      calibration saw: a policy meets observations beyond those of its calibration rollout, and clipping
      them made a solved CartPole PPO agent fail 6 of 50 episodes. The output layers (Linear layers whose
      output reaches the model's output through no other layer, :func:`output_linear_names`) return float:
      int8 weights, input quantized per batch, as dynamic quantization; an int8 output has one step over its
      whole range (0.78 for Q-values near 100), coarser than the gaps between Q-values that a greedy policy
      picks by (0.05), which dropped a solved CartPole DQN from 500 to 51. Activations in between keep their
      calibrated ranges. (The eager-mode fallback cannot find these layers: its input is quantized per batch,
      its outputs stay int8.)
      Weights are symmetric int8 (PyTorch's codes -128..127, scale ``max|w| / 127.5``): per output channel
      for convolutions (transposed ones per tensor, as the engine needs) and, with ``per_channel_linear``, for
      linear layers; per tensor otherwise (dynamic path: ``default_dynamic_qconfig`` or
      ``per_channel_dynamic_qconfig``; static path: the engine's activation observer with a per-tensor or
      per-channel weight observer, see :func:`static_qconfigs`).
      A bare top-level layer is put in a :class:`LayerHolder` on both paths.
    - ``"intN"``, N in 2..16 other than 8, and ``"sim8"`` (N = 8): simulated (fake) quantization, weights
      only: each Linear / convolution weight is replaced by its :func:`quantize_tensor` value at N bits, per
      output channel for convolutions and, with ``per_channel_linear``, for linear layers (per tensor
      otherwise, as QuaRL). Biases and activations stay float. With ``activations`` the input of every such
      layer is fake-quantized too (asymmetric, N bits), over ranges calibrated on ``calibration`` when
      given, else over each batch's own range. ``"sim8"`` is the 8-bit point of this simulated sweep, to
      compare like with like: ``"int8"``'s kernels quantize activations too and round weights to PyTorch's
      codes -128..127 (scale ``max|w| / 127.5``, where :func:`quantize_tensor` uses -127..127 and ``/ 127``).

    Parametrizations on weights (e.g. QAT fake quantization) are made permanent in the integer copies.

    Non-finite weights: at ``"int8"`` and ``"intN"`` a Linear / convolution weight holding NaN or inf raises a
    ``ValueError`` naming the layer and counting them (quantized, it would destroy every other value sharing
    its scale). ``"fp16"`` / ``"bf16"`` cast each value on its own, so a NaN or inf passes through as itself
    and changes nothing else: the copy computes what the float model computes.
    """
    _check_module(module)
    spec = parse_precision(precision)
    detach_pruned_weights_(module)  # a pruned weight computed with grad cannot be deep-copied
    model = copy.deepcopy(module).eval()
    if spec.is_float:
        if spec.name == "fp32":
            return model.float()
        return CastPrecision(model.to(spec.dtype), spec.dtype).eval()
    bake_parametrizations(model)
    if not quantizable_layers(model):
        raise ValueError(
            f"{type(module).__name__} has no Linear or convolution layer to quantize to {spec.name}"
        )
    check_finite_weights(model, spec.name)
    if not spec.simulated:  # int8: real integer kernels
        return _int8(model, calibration_batches(calibration), activations, per_channel_linear)
    return _simulated(model, spec.bits, calibration_batches(calibration), activations, per_channel_linear)


def _simulated(
    model: nn.Module, bits: int, batches: list[Tensor], activations: bool, per_channel_linear: bool
) -> nn.Module:
    if activations:
        quantizers = attach_input_quantizers(model, bits, momentum=None, dynamic=not batches)
        if batches:
            for q in quantizers:
                q.enabled, q.observing = False, True
            with torch.no_grad():
                for batch in batches:
                    model(batch)
            for q in quantizers:
                q.enabled, q.observing = True, False
    with torch.no_grad():
        for name, layer in quantizable_layers(model):
            per_channel = per_channel_linear or not isinstance(layer, nn.Linear)
            axis = output_channel_axis(layer) if per_channel else None
            what = f"{weight_name(name)} to int{bits}"
            layer.weight.copy_(quantize_tensor(layer.weight, bits, per_channel_axis=axis, what=what))
    return model


def _int8(model: nn.Module, batches: list[Tensor], activations: bool, per_channel_linear: bool) -> nn.Module:
    if is_quantizable(model):
        model = LayerHolder(model)  # torch.ao swaps children only, never the root module it is given
    if activations or has_convolutions(model):
        if not batches:
            raise ValueError(
                "int8 static quantization (models with convolutions, or activations=True) needs calibration "
                "data: pass calibration=<a batch of typical inputs, or an iterable of batches>"
            )
        return _int8_static(model, batches, per_channel_linear)
    return _int8_dynamic(model, per_channel_linear)


def _int8_dynamic(model: nn.Module, per_channel_linear: bool) -> nn.Module:
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

    if not any(isinstance(m, nn.Linear) for m in model.modules()):
        raise ValueError("int8 dynamic quantization found no nn.Linear layer")
    # quantize_dynamic's default is per tensor; the per-channel qconfig gives each output row its own scale.
    qconfig = per_channel_dynamic_qconfig if per_channel_linear else default_dynamic_qconfig
    with quiet_deprecations():
        quantized = quantize_dynamic(model, {nn.Linear: qconfig}, dtype=torch.qint8)
    return quantized.eval()


def static_qconfigs(engine: str) -> tuple[Any, Any]:
    """Return the static int8 ``(per-channel, per-tensor)`` qconfigs: ``engine``'s activation observer, weights per output channel or per tensor.

    Both use the engine's default activation observer (x86 / fbgemm: ``HistogramObserver`` with
    ``reduce_range``) and symmetric int8 weights; x86's own default would make every layer per channel.
    """
    from torch.ao.quantization import (
        QConfig,
        default_per_channel_weight_observer,
        default_weight_observer,
        get_default_qconfig,
    )

    with quiet_deprecations():
        activation = get_default_qconfig(engine).activation
    return (
        QConfig(activation=activation, weight=default_per_channel_weight_observer),
        QConfig(activation=activation, weight=default_weight_observer),
    )


def _linear_names(model: nn.Module) -> list[str]:
    return [name for name, layer in quantizable_layers(model) if isinstance(layer, nn.Linear)]


def output_linear_names(model: nn.Module) -> list[str]:
    """Return the names of the ``nn.Linear`` layers whose output reaches ``model``'s output through no other layer.

    Operations without weights (activations, reshapes) may lie between. Raises ``torch.fx.proxy.TraceError``
    when ``model`` cannot be traced symbolically.
    """
    import torch.fx

    traced = torch.fx.symbolic_trace(model)
    modules = dict(traced.named_modules())
    frontier = [node for node in traced.graph.nodes if node.op == "output"]
    seen, found = set(frontier), []
    while frontier:
        for arg in frontier.pop().all_input_nodes:
            if arg in seen:
                continue
            seen.add(arg)
            layer = modules.get(str(arg.target)) if arg.op == "call_module" else None
            if layer is None or not is_quantizable(layer):
                frontier.append(arg)
            elif isinstance(layer, nn.Linear):
                found.append(str(arg.target))
    return found


class QuantizePerBatch(nn.Module):
    """Quantize a float tensor to ``dtype`` with the range of the batch itself (``torch.quantize_per_tensor_dynamic``)."""

    def __init__(self, dtype: torch.dtype = torch.quint8, reduce_range: bool = False):
        super().__init__()
        self.dtype, self.reduce_range = dtype, reduce_range

    def forward(self, x: Tensor) -> Tensor:
        return torch.quantize_per_tensor_dynamic(x, self.dtype, self.reduce_range)

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}, reduce_range={self.reduce_range}"


def quantize_inputs_per_batch_(graph_module: Any, reduce_range: bool) -> int:
    """Return how many quantizations of the model's input ``graph_module`` had, now made per batch (in place).

    ``graph_module`` is a converted FX model; each ``quantize_per_tensor`` reached from an input through float
    operations only (e.g. a ``Flatten``) is replaced by ``quantize_per_tensor_dynamic``.
    """
    graph = graph_module.graph
    frontier = [node for node in graph.nodes if node.op == "placeholder"]
    seen, replaced = set(frontier), 0
    while frontier:
        for user in list(frontier.pop().users):
            if user in seen:
                continue
            seen.add(user)
            if user.op == "call_function" and user.target is torch.quantize_per_tensor:
                with graph.inserting_before(user):
                    per_batch = graph.call_function(
                        torch.quantize_per_tensor_dynamic, (user.args[0], user.args[3], reduce_range)
                    )
                user.replace_all_uses_with(per_batch)
                graph.erase_node(user)
                replaced += 1
            else:
                frontier.append(user)
    graph.eliminate_dead_code()
    graph_module.recompile()
    return replaced


def _int8_static(model: nn.Module, batches: list[Tensor], per_channel_linear: bool) -> nn.Module:
    import torch.fx
    from torch.ao.quantization import (
        default_dynamic_qconfig,
        get_default_qconfig_mapping,
        per_channel_dynamic_qconfig,
    )
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    engine = torch.backends.quantized.engine
    per_channel, per_tensor = static_qconfigs(engine)
    # Convolutions per output channel; linear layers per tensor unless asked (QuaRL's rule, as intN). The
    # engine's mapping keeps its fixed ranges for tanh / sigmoid outputs (and per-tensor transposed convs).
    with quiet_deprecations():
        mapping = get_default_qconfig_mapping(engine).set_global(per_channel)
    if not per_channel_linear:
        for name in _linear_names(model):
            mapping.set_module_name(name, per_tensor)  # by name: a fused LinearReLU keeps its Linear's name
    with quiet_deprecations():
        try:
            # The output layers keep float outputs (int8 weights, inputs quantized per batch): an int8 output
            # has one step over its whole range, coarser than the gaps an argmax over Q-values decides on.
            for name in output_linear_names(model):
                mapping.set_module_name(
                    name, per_channel_dynamic_qconfig if per_channel_linear else default_dynamic_qconfig
                )
            prepared = prepare_fx(model, mapping, example_inputs=(batches[0],))
        except torch.fx.proxy.TraceError:
            return _int8_static_eager(model, batches, per_channel, None if per_channel_linear else per_tensor)
        with torch.no_grad():
            for batch in batches:
                prepared(batch)
        converted = convert_fx(prepared).eval()
    quantize_inputs_per_batch_(converted, _reduces_range(per_channel))
    return converted


def _reduces_range(qconfig: Any) -> bool:
    with quiet_deprecations():
        return bool(getattr(qconfig.activation(), "reduce_range", False))


def _int8_static_eager(
    model: nn.Module, batches: list[Tensor], qconfig: Any, linear_qconfig: Any
) -> nn.Module:
    from torch.ao.quantization import QuantWrapper, convert, prepare

    wrapped = QuantWrapper(model).eval()
    wrapped.qconfig = qconfig
    if linear_qconfig is not None:
        for layer in model.modules():
            if isinstance(layer, nn.Linear):
                layer.qconfig = linear_qconfig
    prepare(wrapped, inplace=True)
    with torch.no_grad():
        for batch in batches:
            wrapped(batch)
    convert(wrapped, inplace=True)
    wrapped.quant = QuantizePerBatch(wrapped.quant.dtype, _reduces_range(qconfig))
    try:
        with torch.no_grad():
            wrapped(batches[0])
    except Exception as err:  # an eager-mode model runs quantized tensors through all its code
        raise RuntimeError(
            f"{type(model).__name__} cannot be traced by torch.fx and fails in eager-mode static quantization "
            f"({err}); make its forward traceable (no Python control flow on tensor values) or quantize the "
            "traceable submodules separately"
        ) from err
    return wrapped.eval()
