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

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlq.deploy.export_c import CExport, write_c
from rlq.deploy.reader import OutputSpec, read_policy

FORMATS = ("c", "onnx")


def _algorithm_of_zip(path: Path) -> str:
    """Return the SB3 algorithm name a model file was saved by (from its policy class's module)."""
    try:
        with zipfile.ZipFile(path) as archive:
            data = json.loads(archive.read("data"))
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a Stable-Baselines3 model file ({type(e).__name__}: {e})") from e
    module = str(data.get("policy_class", {}).get("__module__", ""))
    parts = module.split(".")
    if len(parts) < 3 or parts[0] != "stable_baselines3":
        raise ValueError(f"{path}: its policy class module {module!r} names no Stable-Baselines3 algorithm")
    return parts[1].upper()


def load_policy_source(source: Any) -> Any:
    """Return the model or module ``source`` names: itself, an SB3 ``.zip`` loaded, or a run folder's agent."""
    if not isinstance(source, (str, os.PathLike)):
        return source
    from rlq.rl.agents import algorithm_class
    from rlq.sb3.checkpoint import load_compressed

    path = Path(source)
    if path.is_dir():
        return _load_run_agent(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file or run folder at {path}")
    return load_compressed(algorithm_class(_algorithm_of_zip(path)), path)


def _load_run_agent(folder: Path) -> Any:
    """Return the agent of a run folder's newest complete checkpoint, its compression re-applied."""
    from rlq.core.jsonio import read_json
    from rlq.rl.agents import algorithm_class
    from rlq.rl.checkpoints import latest_checkpoint
    from rlq.sb3.checkpoint import load_compressed

    params = read_json(folder / "params.json")
    if not params or "algorithm" not in params:
        raise ValueError(f"{folder} is not an agent's run folder (no params.json naming an algorithm)")
    found = latest_checkpoint(folder / "checkpoints")
    if found is None:
        raise FileNotFoundError(f"{folder}/checkpoints holds no complete checkpoint")
    return load_compressed(algorithm_class(params["algorithm"]), found[1])


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


def acting_module(policy: Any) -> nn.Module:
    """Return ``policy``'s action path as plain dense layers with its post-processing (:class:`ActionHead`).

    Each layer holds the effective weight the PyTorch forward multiplies by (a pruning mask applied, a
    block-circulant layer expanded), so that the module traces to stock ONNX operators.
    """
    specs, output = read_policy(policy)  # raises TypeError naming an unsupported layer
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
    calibration: np.ndarray | None = None,
    vec_normalize: Any = None,
) -> CExport | Path:
    """Export ``source`` (see the module docstring) into the new folder ``out``; return what was written.

    ``format="c"`` returns the :class:`rlq.deploy.export_c.CExport`; ``"onnx"`` the path of
    ``<out>/<name>.onnx``. ``precision``: ``"fp32"`` or ``"int8"``. ``out`` must not exist; nothing is
    written when the source cannot be exported.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; choose one of {', '.join(FORMATS)}")
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; export into a new folder")
    policy = load_policy_source(source)
    if format == "c":
        return write_c(policy, out, name=name, precision=precision, vec_normalize=vec_normalize)
    if vec_normalize is not None:
        raise ValueError("ONNX export does not take a VecNormalize; normalise observations before the model")
    return _write_onnx(policy, out, name, precision, calibration)


def _write_onnx(policy: Any, out: Path, name: str, precision: str, calibration: np.ndarray | None) -> Path:
    from rlq.quant.onnx_backend import export_onnx

    module = acting_module(policy)
    specs, _ = read_policy(policy)
    example = torch.zeros(1, specs[0].n_in)
    out.mkdir(parents=True)
    try:
        return export_onnx(module, out / f"{name}.onnx", example, precision, calibration=calibration)
    except BaseException:
        for f in out.iterdir():
            f.unlink()
        out.rmdir()
        raise
