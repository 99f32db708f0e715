"""QAT on an SB3 policy: which layers get quantizers, preparing the policy, its plain state dict, conversion.

:func:`prepare_policy_qat_` puts :class:`rlq.sb3.qat_stacking.MemoizedWeightFakeQuant` on the layers
:func:`qat_layers` picks (every network, or the action path only), on top of any compression
(:func:`rlq.sb3.qat_stacking.stack_fake_quant_`).

Saving and loading: a converted policy holds plain tensors (``model.save`` then ``PPO.load`` works); a policy
*being* trained with QAT saves its latent float weights under their plain names (the state-dict hooks
installed here), so SB3's ``load`` accepts it and the same :class:`rlq.sb3.qat_callback.QATCallback` prepares
it again when training resumes (only observed activation ranges are re-observed).
:mod:`rlq.sb3.qat_checkpoint` keeps the quantization state itself inside the zip.

Conversion: :func:`convert_policy_qat_` bakes the quantization into the stored values and keeps the
compression: a block-circulant layer keeps its (quantized) B-vectors, a pruned layer its mask, and the
converted policy computes bit for bit what the fake-quantized one did; each layer is marked with its bit
width (:func:`rlq.quant.bits.mark_weight_format_`) so that :func:`rlq.quant.bits_per_weight` counts it.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from rlq.compress.block_circulant import is_block_circulant, stored_target
from rlq.compress.masks import mask_of, refresh_masked_, stored_tensor
from rlq.quant import WeightFakeQuant, is_qat
from rlq.quant.activations import (
    INPUT_QUANTIZER,
    ActivationQuantizer,
    attach_input_quantizers,
    input_quantizers,
)
from rlq.quant.bits import mark_weight_format_
from rlq.quant.quantizable import output_channel_axis
from rlq.quant.tensor import check_bits, quantize_tensor
from rlq.sb3.networks import named_layers, refresh_optimizers
from rlq.sb3.qat_stacking import (
    MemoizedWeightFakeQuant,
    _fake_quant_on_top,
    lift_fake_quant_,
    stack_fake_quant_,
)

_ORIGINAL = "parametrizations.weight.original"
#: a QAT layer's keys -> the plain layer's (a mask beneath QAT is torch.nn.utils.prune's on the plain layer)
_PLAIN_KEYS = {_ORIGINAL: "weight", f"{_ORIGINAL}_orig": "weight_orig", f"{_ORIGINAL}_mask": "weight_mask"}
_HOOKED = "_rlq_qat_state_dict_hooks"


def _pure_qat(layer: nn.Module) -> bool:
    """Return whether ``layer.weight``'s only parametrization is QAT fake quantization."""
    if not parametrize.is_parametrized(layer, "weight"):
        return False
    return all(isinstance(p, WeightFakeQuant) for p in layer.parametrizations["weight"])


def _input_quantizer(layer: nn.Module) -> ActivationQuantizer | None:
    quantizer = getattr(layer, INPUT_QUANTIZER, None)
    return quantizer if isinstance(quantizer, ActivationQuantizer) else None


def _plain_state_dict(layer: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """State-dict post-hook: store a QAT layer as the plain (maybe pruned) layer it wraps, without quantizer."""
    if _pure_qat(layer):
        for stacked, plain in _PLAIN_KEYS.items():
            if prefix + stacked in state_dict:
                state_dict[prefix + plain] = state_dict.pop(prefix + stacked)
    if _input_quantizer(layer) is not None:
        for name in ("min_val", "max_val"):
            state_dict.pop(f"{prefix}{INPUT_QUANTIZER}.{name}", None)


def _accept_plain_state_dict(
    layer: nn.Module,
    state_dict: dict,
    prefix: str,
    local_metadata: dict,
    strict: bool,
    missing_keys: list,
    unexpected_keys: list,
    error_msgs: list,
) -> None:
    """Load-state-dict pre-hook: load a plain layer's state (what :func:`_plain_state_dict` wrote) into a QAT layer."""
    if _pure_qat(layer):
        for stacked, plain in _PLAIN_KEYS.items():
            if prefix + plain in state_dict and prefix + stacked not in state_dict:
                state_dict[prefix + stacked] = state_dict.pop(prefix + plain)
    quantizer = _input_quantizer(layer)
    if quantizer is not None:  # ranges are not part of the plain state: keep the current ones
        for name in ("min_val", "max_val"):
            state_dict.setdefault(
                f"{prefix}{INPUT_QUANTIZER}.{name}", getattr(quantizer, name).detach().clone()
            )


def _install_state_dict_hooks(layer: nn.Module) -> None:
    if getattr(layer, _HOOKED, False):
        return
    layer.register_state_dict_post_hook(_plain_state_dict)
    layer.register_load_state_dict_pre_hook(_accept_plain_state_dict)
    setattr(layer, _HOOKED, True)


QAT_NETWORKS = ("all", "action_path")
"""What :class:`QATCallback` quantizes: every network (QuaRL), or only the layers the deployed policy runs."""


def check_qat_networks(networks: str) -> str:
    """Return ``networks`` if it is one of :data:`QAT_NETWORKS`, else raise ValueError naming the choices."""
    if networks not in QAT_NETWORKS:
        raise ValueError(f"networks must be one of {', '.join(QAT_NETWORKS)}, got {networks!r}")
    return networks


_TARGET_TWINS = {"actor.": "actor_target.", "q_net.": "q_net_target."}
"""Online network prefix -> its target network's prefix, for the action path's target twins (TD3/DDPG, DQN)."""


def qat_layers(
    policy: nn.Module, skip_first_last: bool = False, networks: str = "all"
) -> dict[str, nn.Module]:
    """Return ``{qualified name: layer}`` of the policy's layers that QAT quantizes (``networks``: :data:`QAT_NETWORKS`).

    ``"all"``: every network, targets included. ``"action_path"``: the layers of
    :func:`rlq.sb3.action_path.action_network` (what a deployed policy runs; a features extractor shared with
    the value function included) and their target twins, so polyak updates keep pairing identical
    parametrizations; critics and value heads, which are never shipped, train in float.
    """
    layers = named_layers(policy, skip_first_last=skip_first_last)
    if check_qat_networks(networks) == "all":
        return layers
    from rlq.sb3.action_path import action_network

    path, _ = action_network(policy)
    on_path = {id(m) for m in path.modules()}
    names = {name for name, layer in layers.items() if id(layer) in on_path}
    twins = {
        twin + name[len(online) :]
        for name in names
        for online, twin in _TARGET_TWINS.items()
        if name.startswith(online)
    }
    return {name: layer for name, layer in layers.items() if name in names | twins}


def prepare_policy_qat_(
    policy: nn.Module,
    bits: int,
    activations: bool = False,
    per_channel: bool = True,
    skip_first_last: bool = False,
    networks: str = "all",
) -> list[str]:
    """Return the names of the layers of an SB3 policy prepared (in place) for QAT, enabled.

    ``networks`` picks the layers (:func:`qat_layers`): every network, or the action path only.

    Online and target networks get identical quantizers, so SB3's polyak updates (which zip the two
    networks' ``parameters()``) keep pairing the same tensors. A compressed layer (block-circulant or
    pruned) gets the quantizer on top of its compression (:func:`rlq.sb3.qat_stacking.stack_fake_quant_`);
    quantizers are :class:`rlq.sb3.qat_stacking.MemoizedWeightFakeQuant`, which quantize each weight once
    per value it takes. Optimizer states are refreshed (:func:`rlq.sb3.networks.refresh_optimizers`); the
    Parameter objects stay the same, so the optimizers keep training them.
    """
    check_bits(bits)
    if is_qat(policy):
        raise ValueError("the policy is already prepared for QAT")
    layers = qat_layers(policy, skip_first_last, networks)
    if not layers:
        raise ValueError(f"{type(policy).__name__} has no layer to quantize")
    for name, layer in layers.items():
        axis = output_channel_axis(layer) if per_channel else None
        stack_fake_quant_(layer, [MemoizedWeightFakeQuant(bits, axis, layer_name=name)])
        if activations:
            attach_input_quantizers(layer, bits, momentum=0.01)
        _install_state_dict_hooks(layer)
    refresh_optimizers(policy)
    return list(layers)


def _bake_quantized_values_(layer: nn.Module, quantizers: list[WeightFakeQuant]) -> None:
    """Replace the stored values of a layer just lifted off ``quantizers`` by their quantized values, in place.

    A block-circulant weight's rows of one block row hold the same B-vector values, so a per-output-channel
    scale of the dense weight is a per-block-row scale of the B-vectors (their axis 0): quantizing the
    vectors gives exactly the weight QAT computed, bit for bit.
    """
    target, name = stored_target(layer)
    stored, mask = stored_tensor(target, name), mask_of(target, name)
    values = stored.detach() if mask is None else stored.detach() * mask
    for quantizer in quantizers:
        axis = quantizer.axis
        if is_block_circulant(layer) and axis not in (None, 0):
            raise ValueError(f"a block-circulant weight quantized along axis {axis} has no per-vector scale")
        values = quantize_tensor(values, quantizer.bits, axis, symmetric=True)
        mark_weight_format_(layer, quantizer.bits, quantizer.axis)
    with torch.no_grad():
        stored.copy_(values)
    refresh_masked_(target)


def convert_policy_qat_(policy: nn.Module) -> nn.Module:
    """Return the policy with its quantized weights baked into its stored values, compression kept.

    Like :func:`rlq.quant.convert_qat_` (each weight then takes at most ``2^bits`` values per output
    channel or tensor, activation quantizers frozen), but a compressed layer stays compressed: a
    block-circulant layer keeps its (quantized) B-vectors, a pruned layer its mask. The converted policy
    computes exactly what the fake-quantized one computed.
    """
    layers = [layer for layer in policy.modules() if _fake_quant_on_top(layer)]
    if not layers:
        raise ValueError("module has no QAT quantizer to convert: call prepare_qat_ first")
    for layer in layers:
        _bake_quantized_values_(layer, lift_fake_quant_(layer))
    for quantizer in input_quantizers(policy):
        quantizer.enabled, quantizer.observing = True, False
    refresh_optimizers(policy)
    return policy


__all__ = [
    "QAT_NETWORKS",
    "check_qat_networks",
    "convert_policy_qat_",
    "prepare_policy_qat_",
    "qat_layers",
]
