"""Saving and loading a model during or after QAT: its quantization structure and state beside SB3's zip.

- A converted policy holds plain tensors: ``model.save`` then ``PPO.load`` works as for any model (with
  ``activations=True`` the loaded policy has the quantized weights but not the activation quantizers, which
  are structure SB3 does not know: use :func:`load_qat`).
- A policy *being* trained with QAT (parametrized weights) also saves with ``model.save``: rlq installs
  state-dict hooks on the quantized layers so the file holds the latent float weights under their plain
  names (``...weight``), which SB3's ``load`` accepts. Loading such a file gives the float model without
  its quantizers; training it again with the same :class:`rlq.sb3.qat_callback.QATCallback` prepares it again at the
  start of ``learn`` and re-enables quantization if the delay has passed. That is what happens when a run of
  a training with :class:`rlq.rl.resume.Checkpoints` is interrupted and resumed: nothing is lost but the
  observed activation ranges (``activations=True``), which are re-observed from the next batches.
- :func:`save_qat` / :func:`load_qat` keep the quantization state itself (bits, axes, whether enabled,
  activation ranges) inside the zip (as ``rlq_qat.json``), so a model loads back exactly as it was saved,
  parametrized or converted with activation quantizers.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from rlq.quant import WeightFakeQuant
from rlq.quant.activations import attach_input_quantizers
from rlq.quant.quantizable import output_channel_axis
from rlq.sb3.checkpoint import zip_path
from rlq.sb3.networks import refresh_optimizers
from rlq.sb3.qat_policy import _input_quantizer, _install_state_dict_hooks, _pure_qat

QAT_FILE = "rlq_qat.json"
"""The member of an SB3 zip that holds the quantization state."""


def _layer_state(layer: nn.Module) -> dict[str, Any]:
    state: dict[str, Any] = {}
    if _pure_qat(layer):
        (quantizer,) = [p for p in layer.parametrizations["weight"] if isinstance(p, WeightFakeQuant)]
        state.update(bits=quantizer.bits, axis=quantizer.axis, enabled=quantizer.enabled)
    inputs = _input_quantizer(layer)
    if inputs is not None:
        finite = inputs.has_range
        state["input"] = dict(
            bits=inputs.bits,
            momentum=inputs.momentum,
            dynamic=inputs.dynamic,
            enabled=inputs.enabled,
            observing=inputs.observing,
            min_val=float(inputs.min_val) if finite else None,
            max_val=float(inputs.max_val) if finite else None,
        )
    return state


def qat_state(policy: nn.Module) -> dict[str, Any]:
    """Return the QAT structure of a policy as JSON-ready data: per layer, weight quantizer and input quantizer."""
    layers = {}
    for name, layer in policy.named_modules():
        state = _layer_state(layer)
        if state:
            layers[name] = state
    return {"format": 1, "layers": layers}


def apply_qat_state_(policy: nn.Module, state: dict[str, Any]) -> nn.Module:
    """Return the policy with the QAT structure of :func:`qat_state` re-created in place (weights untouched)."""
    if state.get("format") != 1:
        raise ValueError(f"unknown QAT state format {state.get('format')!r}")
    for name, entry in state["layers"].items():
        layer = policy.get_submodule(name)
        if "bits" in entry:
            if _pure_qat(layer):
                raise ValueError(f"layer {name} is already prepared for QAT")
            quantizer = WeightFakeQuant(entry["bits"], entry["axis"])
            quantizer.enabled = bool(entry["enabled"])
            parametrize.register_parametrization(layer, "weight", quantizer)
        if "input" in entry:
            spec = entry["input"]
            if _input_quantizer(layer) is None:
                attach_input_quantizers(
                    layer, spec["bits"], momentum=spec["momentum"], dynamic=spec["dynamic"]
                )
            quantizer = _input_quantizer(layer)
            quantizer.enabled, quantizer.observing = bool(spec["enabled"]), bool(spec["observing"])
            lo, hi = spec["min_val"], spec["max_val"]
            quantizer.min_val.fill_(math.inf if lo is None else lo)
            quantizer.max_val.fill_(-math.inf if hi is None else hi)
        _install_state_dict_hooks(layer)
    refresh_optimizers(policy)
    return policy


def save_qat(model: Any, path: str | os.PathLike, **save_kwargs: Any) -> Path:
    """Return the path of ``model`` saved with SB3's ``save`` plus its QAT state (``rlq_qat.json`` in the zip).

    Works before, during and after QAT; :func:`load_qat` restores the model as it was. SB3's own ``load``
    also reads the file and gives the float (latent) weights without quantizers.
    """
    model.save(path, **save_kwargs)
    target = zip_path(path, must_exist=True)
    with zipfile.ZipFile(target, "a") as archive:
        archive.writestr(QAT_FILE, json.dumps(qat_state(model.policy), indent=1))
    return target


def load_qat(algorithm: str | type, path: str | os.PathLike, env: Any = None, **load_kwargs: Any) -> Any:
    """Return the model saved by :func:`save_qat`, with its QAT structure and state re-created.

    ``algorithm`` is an SB3 class or its name (``"PPO"``). A file without QAT state (a plain ``model.save``)
    loads as SB3 would load it.
    """
    from rlq.rl.agents import algorithm_class

    cls = algorithm_class(algorithm) if isinstance(algorithm, str) else algorithm
    path = zip_path(path, must_exist=True)
    model = cls.load(path, env=env, **load_kwargs)
    with zipfile.ZipFile(path) as archive:
        if QAT_FILE not in archive.namelist():
            return model
        state = json.loads(archive.read(QAT_FILE).decode())
    # SB3 loaded the latent weights into plain layers; the quantizers go back on top, weights unchanged
    with torch.no_grad():
        apply_qat_state_(model.policy, state)
    return model


def distinct_values(layer: nn.Module, per_channel: bool = False) -> int:
    """Return the number of distinct values of a layer's weight (the most in any output channel with ``per_channel``)."""
    weight = layer.weight.detach()
    if not per_channel:
        return int(weight.unique().numel())
    rows = weight.movedim(output_channel_axis(layer), 0)
    return max(int(row.unique().numel()) for row in rows.reshape(rows.shape[0], -1))
