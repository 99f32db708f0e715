"""``rlq export``: a trained policy out of Python, as a C file pair or as an ONNX model.

:func:`export_policy` takes an SB3 model, an SB3 model file (``.zip``, plain or written by
:func:`rlq.sb3.save_compressed`), a run folder's trained agent (its newest checkpoint), or an
``nn.Sequential`` actor, and writes into a new folder:

- ``format="c"``: ``policy.h`` and ``policy.c`` (:func:`rlq.deploy.export_c.write_c`): the weights in their
  stored form, SB3's deterministic post-processing in the function.
- ``format="onnx"``: ``policy.onnx`` for stock ONNX Runtime (:func:`rlq.quant.export_onnx`): the action path
  with the same post-processing in the graph (scaling and clipping, or the argmax), at fp32, or int8 (QDQ,
  calibrated on ``calibration`` observations, else dynamic). ONNX Runtime has no kernel for block-sparse or
  block-circulant weights: they are written dense, as the PyTorch forward multiplies by them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlq.core.staging import staged_folder
from rlq.deploy.export_c import CExport, network_inputs, write_c
from rlq.deploy.formats import ACTION_SCALING, Affine
from rlq.deploy.reader import OutputSpec, read_policy
from rlq.deploy.runtime import CompiledPolicy, compile_policy

FORMATS = ("c", "onnx")


def load_model_file(path: str | os.PathLike) -> Any:
    """Return the SB3 model saved at ``path`` (plain, or by :func:`rlq.sb3.save_compressed`, its compression
    re-applied), loaded as the algorithm that wrote it (:func:`rlq.rl.algorithms.algorithm_of_model_file`)."""
    from rlq.rl.agents import algorithm_class
    from rlq.rl.algorithms import algorithm_of_model_file
    from rlq.sb3.checkpoint import load_compressed

    algorithm = algorithm_of_model_file(path)
    try:
        return load_compressed(algorithm_class(algorithm), path)
    except Exception as e:  # a truncated or damaged entry: torch, zipfile and pickle each raise their own
        first = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(
            f"{path}: a {algorithm} model file that cannot be loaded ({type(e).__name__}: {first})"
        ) from e


def load_policy_source(source: Any) -> Any:
    """Return the model or module ``source`` names: itself, an SB3 model file loaded, or a run folder's agent."""
    if not isinstance(source, (str, os.PathLike)):
        return source
    path = Path(source)
    if path.is_dir():
        return _load_run_agent(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file or run folder at {path}")
    return load_model_file(path)


def agent_folders(folder: Path) -> list[Path]:
    """Return the folders under ``folder`` (itself included) holding a trained agent's ``checkpoints/``."""
    if (folder / "checkpoints").is_dir():
        return [folder]
    return sorted(
        p.parent for p in folder.rglob("checkpoints") if p.is_dir() and any(p.glob("model_*_steps.zip"))
    )


def _load_run_agent(folder: Path) -> Any:
    """Return the agent of a run folder: its newest checkpoint that loads, its compression re-applied.

    ``folder`` is an agent's folder (a job of an experiment, or a run folder holding ``checkpoints/``), or a
    run folder holding exactly one such agent. A damaged newest checkpoint is passed over, with a warning, for
    the one before it (:func:`rlq.rl.checkpoints.load_newest_checkpoint`).
    """
    from rlq.rl.checkpoints import load_newest_checkpoint

    agents = agent_folders(folder)
    if not agents:
        raise FileNotFoundError(
            f"{folder} holds no trained agent (no checkpoints/ folder with a model_*_steps.zip)"
        )
    if len(agents) > 1:
        shown = ", ".join(str(a.relative_to(folder)) for a in agents[:4]) + (
            ", ..." if len(agents) > 4 else ""
        )
        raise ValueError(
            f"{folder} holds {len(agents)} trained agents ({shown}): export one of their folders"
        )
    return load_newest_checkpoint(agents[0] / "checkpoints", load_model_file)[1]


class ActionHead(nn.Module):
    """SB3's deterministic post-processing of an action network's output, as graph ops ONNX exports."""

    def __init__(self, output: OutputSpec):
        super().__init__()
        self.kind = output.kind
        if self.kind == "multi_argmax" or self.kind not in ("values", "argmax", "binary", "continuous"):
            raise TypeError(f"ONNX export has no action head for {self.kind!r} outputs")
        if self.kind == "continuous":
            for key in ("scale", "shift", "low", "high"):
                self.register_buffer(key, torch.as_tensor(getattr(output, key), dtype=torch.float32))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        if self.kind == "continuous":
            return torch.minimum(torch.maximum(y * self.scale + self.shift, self.low), self.high)
        if self.kind == "argmax":
            return y.argmax(dim=1)
        if self.kind == "binary":
            return (y > 0).to(torch.int64)
        return y


def output_for_action_space(network: nn.Sequential, action_space: Any) -> OutputSpec:
    """Return SB3's deterministic post-processing of ``network``'s output for a Gymnasium ``action_space``.

    A ``Box``: an output after a final ``nn.Tanh`` is unscaled from [-1, 1] to ``[low, high]`` (a squashing
    policy, as TD3's, DDPG's and SAC's); any other output is clipped to ``[low, high]``. A ``Discrete``: the
    argmax. Other spaces raise TypeError.
    """
    from gymnasium import spaces

    width = read_policy(network)[0][-1].n_out
    if isinstance(action_space, spaces.Discrete):
        if width != int(action_space.n):
            raise ValueError(
                f"the network has {width} outputs, the Discrete action space {action_space.n} actions"
            )
        return OutputSpec(kind="argmax")
    if not isinstance(action_space, spaces.Box):
        raise TypeError(
            f"exporting an nn.Module actor takes a Box or Discrete action space, got {action_space!r}"
        )
    low, high = (np.asarray(b, np.float64).reshape(-1) for b in (action_space.low, action_space.high))
    if low.size != width:
        raise ValueError(f"the network has {width} outputs, the Box action space {low.size} dimensions")
    if isinstance(list(network.modules())[-1], nn.Tanh):
        half = 0.5 * (high - low)
        scale, shift, low, high = half, low + half, np.full_like(low, -np.inf), np.full_like(high, np.inf)
    else:
        scale, shift = np.ones_like(low), np.zeros_like(low)
    arrays = (np.asarray(a, np.float32) for a in (scale, shift, low, high))
    return OutputSpec("continuous", *arrays)


def takes_action_space(policy: Any, action_space: Any) -> bool:
    """Return whether ``policy`` is an ``nn.Module`` actor given its ``action_space``; raise for a mismatch.

    An SB3 model (or policy) brings its own action space, so ``action_space`` must be None; an actor without
    one has none, so it must be given.
    """
    if not isinstance(policy, nn.Module) or hasattr(policy, "action_space"):
        if action_space is not None:
            raise ValueError(
                "a Stable-Baselines3 model brings its own action space; do not pass action_space"
            )
        return False
    if action_space is None:
        raise ValueError(
            "an nn.Module actor has no action space: pass action_space= (a gymnasium Box or Discrete) for SB3's "
            "post-processing, or use rlq.deploy.write_c to export the network's outputs as they are"
        )
    return True


def _compiled_with_actions(
    actor: nn.Sequential, action_space: Any, precision: str, calibration: np.ndarray | None = None
) -> CompiledPolicy:
    """Return ``actor`` compiled at ``precision`` (its inputs scaled on ``calibration``, observations as the
    network sees them) with ``action_space``'s post-processing after it."""
    output = output_for_action_space(actor, action_space)
    compiled = compile_policy(actor, precision, calibration=calibration, use_kernels=False)
    ops = list(compiled.ops)
    if output.kind == "continuous":
        ops.append(Affine(ACTION_SCALING, output.scale, output.shift, output.low, output.high))
    return CompiledPolicy(ops, output, compiled.obs_dim, use_kernels=False)


def exported_policy(
    policy: Any, precision: str, action_space: Any = None, calibration: np.ndarray | None = None
) -> CompiledPolicy:
    """Return what a C export of ``policy`` at ``precision`` computes: the same codes, the same layers.

    An SB3 model: :func:`rlq.deploy.compile_policy` with ``use_kernels=False`` (the block rule of the exported
    C's plain loops); an ``nn.Sequential`` actor: the same, with its ``action_space``'s post-processing after.
    ``calibration``: observations as the network takes them, for the first layer's input scaling.
    """
    if takes_action_space(policy, action_space):
        return _compiled_with_actions(policy, action_space, precision, calibration)
    return compile_policy(policy, precision, calibration=calibration, use_kernels=False)


def acting_module(policy: Any, action_space: Any = None) -> nn.Module:
    """Return ``policy``'s action path as plain dense layers with its post-processing (:class:`ActionHead`).

    Each layer holds the effective weight the PyTorch forward multiplies by (a pruning mask applied, a
    block-circulant layer expanded), so that the module traces to stock ONNX operators. An ``nn.Sequential``
    with an ``action_space`` gets that space's post-processing (:func:`output_for_action_space`).
    """
    specs, output = read_policy(policy)  # raises TypeError naming an unsupported layer
    if action_space is not None:
        output = output_for_action_space(policy, action_space)
    layers: list[nn.Module] = []
    for spec in specs:
        if spec.kind == "linear":
            linear = nn.Linear(spec.n_in, spec.n_out, bias=spec.bias is not None)
            with torch.no_grad():
                linear.weight.copy_(torch.from_numpy(spec.weight))
                if spec.bias is not None:
                    linear.bias.copy_(torch.from_numpy(spec.bias))
            layers.append(linear)
        if spec.activation != "none":
            layers.append(nn.ReLU() if spec.activation == "relu" else nn.Tanh())
    return nn.Sequential(*layers, ActionHead(output)).eval()


def export_policy(
    source: Any,
    out: str | os.PathLike,
    format: str = "c",
    *,
    precision: str = "fp32",
    name: str = "policy",
    action_space: Any = None,
    calibration: np.ndarray | None = None,
    vec_normalize: Any = None,
) -> CExport | Path:
    """Export ``source`` (see the module docstring) into the new folder ``out``; return what was written.

    ``format="c"`` returns the :class:`rlq.deploy.export_c.CExport`; ``"onnx"`` the path of
    ``<out>/<name>.onnx``. ``precision``: ``"fp32"`` or ``"int8"``. An ``nn.Sequential`` actor needs its
    ``action_space`` (:func:`output_for_action_space`); an SB3 model has its own. ``calibration``: typical
    observations, for ONNX int8's static activation ranges (without them, dynamic quantization) and for the C
    function's input scaling at a quantized precision (:mod:`rlq.deploy.input_scaling`). ``out`` must not exist;
    nothing is written when the source cannot be exported.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; choose one of {', '.join(FORMATS)}")
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; export into a new folder")
    policy = load_policy_source(source)
    if format == "c":
        compiled = exported_policy(
            policy, precision, action_space, network_inputs(calibration, vec_normalize)
        )
        return write_c(compiled, out, name=name, vec_normalize=vec_normalize)
    takes_action_space(policy, action_space)  # refuses an actor without its space, an SB3 model given one
    if vec_normalize is not None:
        raise ValueError("ONNX export does not take a VecNormalize; normalise observations before the model")
    return _write_onnx(policy, out, name, precision, calibration, action_space)


def _write_onnx(
    policy: Any, out: Path, name: str, precision: str, calibration: np.ndarray | None, action_space: Any
) -> Path:
    from rlq.quant.onnx_backend import export_onnx

    module = acting_module(policy, action_space)
    specs, _ = read_policy(policy)
    example = torch.zeros(1, specs[0].n_in)
    with staged_folder(out) as staging:
        path = export_onnx(module, staging / f"{name}.onnx", example, precision, calibration=calibration)
        guard_nonfinite_onnx(path)
    return out / f"{name}.onnx"


def guard_nonfinite_onnx(path: Path) -> None:
    """Rewrite the ONNX policy at ``path`` so that an observation holding NaN or an infinity gives no action.

    Such a row's action becomes NaN in every element (a float action) or -1 (an integer one, an argmax), as
    :class:`rlq.deploy.runtime.CompiledPolicy` gives, and the network sees zeros in its place: dynamic int8
    quantization scales a whole batch by its range, which one NaN would spoil for every row. The test is
    added after quantization, in float (``IsNaN``, ``IsInf``, ``Where``): ONNX Runtime's static quantizer puts
    quantize-dequantize pairs on every tensor it calibrates, which would turn a NaN into a finite code.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    (inp,), (out,) = graph.input, graph.output
    width = inp.type.tensor_type.shape.dim[1].dim_value
    is_float = out.type.tensor_type.elem_type == TensorProto.FLOAT
    raw, clean = f"{out.name}_unguarded", f"{inp.name}_finite"
    for node in graph.node:
        node.input[:] = [clean if i == inp.name else i for i in node.input]
        node.output[:] = [raw if o == out.name else o for o in node.output]
    fill = np.array(np.nan, np.float32) if is_float else np.array(-1, np.int64)
    graph.initializer.extend([
        numpy_helper.from_array(np.ones((width, 1), np.float32), "guard_ones"),
        numpy_helper.from_array(np.zeros((), np.float32), "guard_zero"),
        numpy_helper.from_array(np.array([-1], np.int64), "guard_flat"),
        numpy_helper.from_array(fill, "guard_fill"),
    ])  # fmt: skip
    test = [
        helper.make_node("IsNaN", [inp.name], ["guard_nan"]),
        helper.make_node("IsInf", [inp.name], ["guard_inf"]),
        helper.make_node("Or", ["guard_nan", "guard_inf"], ["guard_either"]),
        helper.make_node("Cast", ["guard_either"], ["guard_each"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["guard_each", "guard_ones"], ["guard_count"]),  # (batch, 1)
        helper.make_node("Greater", ["guard_count", "guard_zero"], ["guard_bad"]),
        helper.make_node("Where", ["guard_bad", "guard_zero", inp.name], [clean]),
    ]
    bad = "guard_bad"
    if len(out.type.tensor_type.shape.dim) == 1:  # an argmax: one action per row
        test.append(helper.make_node("Reshape", ["guard_bad", "guard_flat"], ["guard_bad_row"]))
        bad = "guard_bad_row"
    nodes = [*test, *graph.node, helper.make_node("Where", [bad, "guard_fill", raw], [out.name])]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
