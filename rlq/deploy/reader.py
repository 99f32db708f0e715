"""What a policy computes, read off its modules: a chain of Linear layers with activations and an output rule.

:func:`read_policy` turns an ``nn.Sequential`` (nested ones included) of ``nn.Linear``, ``nn.ReLU``,
``nn.Tanh``, ``nn.Flatten`` and ``nn.Identity``, or a Stable-Baselines3 model or policy (its action path,
:func:`rlq.sb3.action_path.action_network`), into :class:`LinearSpec` rows and one :class:`OutputSpec`.
Each Linear is read in the form rlq stores it: the B-vectors of a block-circulant layer
(:mod:`rlq.compress.block_circulant`), or the effective dense weight (a pruning mask applied), whose zeros
:mod:`rlq.deploy.formats` may turn into a block-sparse layout. Anything else raises a ``TypeError`` that
names the module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils import prune

from rlq.compress import block_size_of, circulant_vectors, is_block_circulant
from rlq.compress.block_circulant import BlockCirculantWeight
from rlq.compress.circulant import circulant_vectors_exact, expand_circulant

ACTIVATIONS = {nn.ReLU: "relu", nn.Tanh: "tanh"}
"""Activations the runtime fuses into the layer before them."""
PASS_THROUGH = (nn.Flatten, nn.Identity)
"""Modules that leave a ``(batch, features)`` array as it is."""
OUTPUT_KINDS = ("values", "argmax", "multi_argmax", "binary", "continuous")
"""How the network's output becomes what a call returns: as is, SB3's argmax (discrete actions, DQN's
greedy action), per-dimension argmax (``MultiDiscrete``), ``logit > 0`` (``MultiBinary``), or a continuous
action scaled (a squashing policy's tanh output to ``[low, high]``) or clipped to the action space."""


@dataclass
class LinearSpec:
    """One Linear layer as stored, with the activation that follows it ("none", "relu" or "tanh").

    ``kind`` is ``"linear"``, or ``"activation"`` for an activation right after another one, which the
    runtime applies to ``n_out`` features on its own.
    """

    name: str
    """Qualified module name."""
    weight: np.ndarray | None
    """The effective dense weight ``(out, in)``, float32: what the PyTorch forward multiplies by. None only for
    a block-circulant layer given by its ``vectors`` alone, for the frequency-domain op, which never reads it
    (:func:`read_policy` always sets it)."""
    bias: np.ndarray | None
    """float32 ``(out,)``, or None."""
    vectors: np.ndarray | None = None
    """The B-vectors ``(out/B, in/B, B)`` of a block-circulant layer (``rlq.compress``'s layout), else None."""
    activation: str = "none"
    kind: str = "linear"
    int8: tuple[np.ndarray, np.ndarray] | None = None
    """The int8 codes ``(out, in)`` and float32 scales ``(out,)`` the weight arrived as (symmetric, per row; ``weight``
    is ``codes * scale``), or None: the int8 ops take them as they are instead of quantizing ``weight`` again,
    which gives the same codes."""

    def __post_init__(self) -> None:
        if self.weight is None and self.vectors is None:
            raise ValueError(f"layer {self.name!r}: a LinearSpec needs its weight or its B-vectors")
        if self.int8 is not None:
            codes, scale = self.int8
            if codes.dtype != np.int8 or self.weight is None or codes.shape != self.weight.shape:
                raise ValueError(f"layer {self.name!r}: int8 codes must be int8 in the weight's shape")
            if np.shape(scale) != (codes.shape[0],):
                raise ValueError(
                    f"layer {self.name!r}: int8 codes need one scale per row, got {np.shape(scale)}"
                )

    @property
    def n_in(self) -> int:
        if self.kind != "linear":
            return self.n_out
        if self.weight is None:
            return int(self.vectors.shape[1] * self.vectors.shape[2])
        return int(self.weight.shape[1])

    @property
    def n_out(self) -> int:
        if self.weight is None:
            return int(self.vectors.shape[0] * self.vectors.shape[2])
        return int(self.weight.shape[0])


@dataclass
class OutputSpec:
    """What becomes of the last layer's output: :data:`OUTPUT_KINDS`, with the action scaling of a Box space."""

    kind: str = "values"
    scale: np.ndarray | None = None
    """Per action dimension, float32: ``action = clip(output * scale + shift, low, high)`` (continuous)."""
    shift: np.ndarray | None = None
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    nvec: list[int] = field(default_factory=list)
    """The sizes of a ``MultiDiscrete`` action space (``multi_argmax``)."""


def _is_plain_linear(module: nn.Module) -> bool:
    cls = type(module)
    if cls is nn.Linear:
        return True
    # parametrize swaps a layer's class for a subclass ("ParametrizedLinear") and keeps its forward
    return cls.__name__.startswith("Parametrized") and cls.__bases__[0] is nn.Linear


def _numpy(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().to(torch.float32).cpu().numpy())


def _effective_weight(layer: nn.Linear) -> torch.Tensor:
    """Return the dense weight the layer's forward uses: a ``torch.nn.utils.prune`` mask applied."""
    orig, mask = layer._parameters.get("weight_orig"), layer._buffers.get("weight_mask")
    if orig is not None and mask is not None:
        return orig * mask
    return layer.weight


def _circulant_vectors(layer: nn.Linear) -> torch.Tensor | None:
    """Return the B-vectors of a block-circulant layer as its forward uses them, or None if it has none."""
    if not is_block_circulant(layer):
        return None
    if all(isinstance(p, BlockCirculantWeight) for p in layer.parametrizations.weight):
        return circulant_vectors(layer)  # its pruning mask applied
    # another parametrization on top (QAT's fake quantization): read the vectors off the effective weight
    weight = layer.weight
    vectors = circulant_vectors_exact(weight, block_size_of(layer))
    return vectors if torch.equal(expand_circulant(vectors), weight) else None


def _check_hooks(name: str, layer: nn.Linear) -> None:
    """Raise TypeError when hooks change the layer's forward beyond a pruning mask (QAT's input quantizers)."""
    pre = [h for h in layer._forward_pre_hooks.values() if not isinstance(h, prune.BasePruningMethod)]
    post = [h for h in layer._forward_hooks.values() if getattr(h, "__module__", "") != "rlq.compress.masks"]
    if pre or post:
        raise TypeError(
            f"layer {name!r} has forward hooks ({', '.join(getattr(h, '__name__', type(h).__name__) for h in pre + post)}) "
            "that rlq.deploy would not run, e.g. QAT's input quantizers: convert or remove them first"
        )


def read_linear(name: str, layer: nn.Linear) -> LinearSpec:
    """Return the :class:`LinearSpec` of one ``nn.Linear`` (plain, pruned or rlq block-circulant)."""
    _check_hooks(name, layer)
    with torch.no_grad():
        vectors = _circulant_vectors(layer)
        weight = expand_circulant(vectors) if vectors is not None else _effective_weight(layer)
        spec = LinearSpec(
            name=name,
            weight=_numpy(weight),
            bias=None if layer.bias is None else _numpy(layer.bias),
            vectors=None if vectors is None else _numpy(vectors),
        )
    if not np.isfinite(spec.weight).all() or (spec.bias is not None and not np.isfinite(spec.bias).all()):
        raise ValueError(f"layer {name!r} holds NaN or inf weights or biases")
    return spec


def _walk(module: nn.Module, prefix: str, out: list[tuple[str, nn.Module]]) -> None:
    if type(module) is nn.Sequential:
        for child_name, child in module.named_children():
            _walk(child, f"{prefix}.{child_name}" if prefix else child_name, out)
    elif _is_flatten_extractor(module):
        out.append((prefix, nn.Flatten()))
    else:
        out.append((prefix or type(module).__name__, module))


def _is_flatten_extractor(module: nn.Module) -> bool:
    """Return whether ``module`` is SB3's ``FlattenExtractor`` (a Flatten), recognised without importing SB3."""
    children = list(module.children())
    return (
        type(module).__name__ == "FlattenExtractor" and len(children) == 1 and type(children[0]) is nn.Flatten
    )


def read_sequential(module: nn.Module) -> list[LinearSpec]:
    """Return the Linear layers of a (nested) ``nn.Sequential`` in forward order, activations fused.

    An activation right after another one gets a :class:`LinearSpec` of kind ``"activation"``.
    """
    if type(module) is not nn.Sequential:
        raise TypeError(
            f"compile_policy takes an nn.Sequential or a Stable-Baselines3 model or policy, got "
            f"{type(module).__name__}"
        )
    flat: list[tuple[str, nn.Module]] = []
    _walk(module, "", flat)
    specs: list[LinearSpec] = []
    fused = True  # whether the last spec's activation slot is taken (nothing to fuse into at the start)
    for name, layer in flat:
        if _is_plain_linear(layer):
            specs.append(read_linear(name, layer))
            fused = False
        elif type(layer) in ACTIVATIONS:
            if fused:
                width = specs[-1].n_out if specs else 0
                specs.append(_activation_only(name, width))
            specs[-1].activation = ACTIVATIONS[type(layer)]
            fused = True
        elif type(layer) not in PASS_THROUGH:
            raise TypeError(
                f"unsupported layer {name!r} ({type(layer).__name__}): rlq.deploy runs nn.Linear (plain, "
                "pruned or rlq block-circulant), nn.ReLU, nn.Tanh, nn.Flatten and nn.Identity in nn.Sequential"
            )
    if not any(s.kind == "linear" for s in specs):
        raise TypeError("the module holds no nn.Linear layer to compile")
    return specs


def _activation_only(name: str, width: int) -> LinearSpec:
    if width == 0:
        raise TypeError(f"activation {name!r} comes before any nn.Linear: its input width is unknown")
    return LinearSpec(name=name, weight=np.zeros((width, 0), np.float32), bias=None, kind="activation")


def read_policy(policy: Any) -> tuple[list[LinearSpec], OutputSpec]:
    """Return the layers and the output rule of an ``nn.Sequential`` or of an SB3 model's action path."""
    if isinstance(policy, nn.Module) and type(policy) is nn.Sequential:
        return read_sequential(policy), OutputSpec()
    if not _looks_like_sb3(policy):
        raise TypeError(
            f"compile_policy takes an nn.Sequential or a Stable-Baselines3 model or policy, got "
            f"{type(policy).__name__}"
        )
    return _read_sb3(policy)


def _looks_like_sb3(obj: Any) -> bool:
    return any(
        c.__module__.startswith("stable_baselines3") for c in type(getattr(obj, "policy", obj)).__mro__
    )


def _read_sb3(model_or_policy: Any) -> tuple[list[LinearSpec], OutputSpec]:
    from gymnasium import spaces

    from rlq.sb3.action_path import ARGMAX, BINARY, CONTINUOUS, MULTI_ARGMAX, action_network, policy_of

    policy = policy_of(model_or_policy)
    obs_space, act_space = policy.observation_space, policy.action_space
    if not (isinstance(obs_space, spaces.Box) and len(obs_space.shape) == 1):
        raise TypeError(
            f"rlq.deploy needs a flat Box observation space (vector observations), got {obs_space}"
        )
    network, kind = action_network(policy)
    specs = read_sequential(network)
    names = {ARGMAX: "argmax", MULTI_ARGMAX: "multi_argmax", BINARY: "binary", CONTINUOUS: "continuous"}
    output = OutputSpec(kind=names[kind])
    if kind == MULTI_ARGMAX:
        output.nvec = [int(n) for n in act_space.nvec]
    if kind == CONTINUOUS:
        low, high = (np.asarray(b, np.float64).reshape(-1) for b in (act_space.low, act_space.high))
        if policy.squash_output:  # SB3's unscale_action: low + 0.5 * (a + 1) * (high - low)
            half = 0.5 * (high - low)
            output.scale, output.shift = half, low + half
            output.low, output.high = np.full_like(low, -np.inf), np.full_like(high, np.inf)
        else:  # SB3 clips an unsquashed action to the bounds
            output.scale, output.shift = np.ones_like(low), np.zeros_like(low)
            output.low, output.high = low, high
        for key in ("scale", "shift", "low", "high"):
            setattr(output, key, getattr(output, key).astype(np.float32))
    if specs[0].n_in != obs_space.shape[0]:
        raise ValueError(
            f"the action path takes {specs[0].n_in} features, the observation space has {obs_space}"
        )
    return specs, output
