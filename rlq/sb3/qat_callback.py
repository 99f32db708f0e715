"""Quantization-aware training (QAT) of any Stable-Baselines3 model, as a callback.

QuaRL (Krishnan et al., arXiv 1910.01055, section 4.2) trains with n-bit fake quantization and a straight-through
estimator after a *quantization delay* (half of training in the public recipe), whose public code inserts no
fake quantization; :class:`QATCallback` registers :class:`rlq.quant.WeightFakeQuant` on the weights of every
network of the policy, and the tests check that the forward pass really changes once the delay has passed.

Usage::

    model = PPO("MlpPolicy", "CartPole-v1")
    model.learn(100_000, callback=QATCallback(bits=4, delay_steps=50_000))
    # the policy is now converted: each weight tensor holds at most 2^4 distinct values (per output channel)

Saving and loading: a converted policy holds plain tensors (``model.save`` then ``PPO.load`` works); a policy
*being* trained with QAT saves its latent float weights under their plain names, so SB3's ``load`` accepts it
and the same :class:`QATCallback` prepares it again when training resumes (only observed activation ranges
are re-observed). :mod:`rlq.sb3.qat_checkpoint` keeps the quantization state itself inside the zip.
Training together with compression. ``model.learn(n, callback=[QATCallback(...), GSTCallback(...)])`` (or
with :class:`rlq.sb3.pruning_callback.GradualPruningCallback`, in either order) trains a policy that is sparse and
low-bit at once; QAT quantizes what the compression stores:

- **Stacking.** The weight quantizer is always the *last* parametrization of a weight. On a
  block-circulant layer it sits on top of :class:`rlq.compress.BlockCirculantWeight`: a per-output-channel
  scale of the dense expansion is a per-block-row scale of the B-vectors (the ``B`` rows of a block row
  hold the same values), so the dense weight stays exactly block-circulant and QAT quantizes the stored
  B-vectors. On a pruned layer the mask moves onto the parametrization's ``original`` beneath the
  quantizer (:func:`stack_fake_quant_`; :func:`rlq.compress.block_circulant.stored_target` finds it
  there), so QAT quantizes the kept values and pruned entries stay exactly 0 (symmetric quantization
  maps 0 to 0).
- **Structural changes.** Every action of a compression callback runs inside :func:`fake_quant_lifted`:
  the quantizers are lifted off, the compression acts on the latent float model as it does without QAT,
  and the same quantizer objects go back on top. Weight quantizers hold no state (the scale follows the
  weights), activation ranges are per tensor (unchanged by the exact transition's reordering), and
  Parameter objects keep their identity, so the optimizers keep training them.
- **Conversion.** :func:`convert_policy_qat_` bakes the quantization into the stored values and keeps
  the compression: a block-circulant layer keeps its (quantized) B-vectors, a pruned layer its mask, and
  the converted policy computes bit for bit what the fake-quantized one did; each layer is marked with its
  bit width (:func:`rlq.quant.bits.mark_weight_format_`) so that :func:`rlq.quant.bits_per_weight` counts it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn
from stable_baselines3.common.callbacks import BaseCallback
from torch.nn.utils import parametrize

from rlq.compress import set_forward_path_
from rlq.compress.block_circulant import expansion_cache_of, is_block_circulant, stored_target
from rlq.compress.circulant import expand_circulant
from rlq.compress.expansion_cache import ExpansionCache, TensorMemo
from rlq.compress.masks import bake_mask_, mask_of, prune_with_mask_, refresh_masked_, stored_tensor
from rlq.core.parametrizations import remove_parametrizations_
from rlq.core.validation import check_non_negative_int
from rlq.quant import WeightFakeQuant, is_qat, set_qat_enabled
from rlq.quant.activations import (
    INPUT_QUANTIZER,
    ActivationQuantizer,
    attach_input_quantizers,
    input_quantizers,
)
from rlq.quant.bits import mark_weight_format_
from rlq.quant.layers import output_channel_axis
from rlq.quant.qat import weight_quantizers
from rlq.quant.tensor import check_bits, quantize_tensor, straight_through
from rlq.sb3.networks import named_layers, refresh_optimizers

log = logging.getLogger(__name__)

QAT_FILE = "rlq_qat.json"
_ORIGINAL = "parametrizations.weight.original"
#: a QAT layer's keys -> the plain layer's (a mask beneath QAT is torch.nn.utils.prune's on the plain layer)
_PLAIN_KEYS = {_ORIGINAL: "weight", f"{_ORIGINAL}_orig": "weight_orig", f"{_ORIGINAL}_mask": "weight_mask"}
_HOOKED = "_rlq_qat_state_dict_hooks"


class MemoizedWeightFakeQuant(WeightFakeQuant):
    """:class:`rlq.quant.WeightFakeQuant` that reuses its quantized weight while its input is unchanged bit for bit.

    Why: an SB3 training step reads each weight several times between two updates of it: TD3's target
    networks (changed only by the polyak update every ``policy_delay`` steps), the batch-1 rollout actor and
    the actor loss read the same actor weights, the critic loss the ``q1`` network the actor loss read. Each
    read quantized anew, about ten passes over the weight; a hit costs one comparison
    (:class:`rlq.compress.expansion_cache.TensorMemo`, which also says when a hit is valid).

    The output is bit for bit the parent's: its unclipped straight-through output is the fake-quantized
    weight plus ``w - w.detach()`` (exactly +0.0), so the memo keeps that output's values and, with
    gradients on, gives them back with the identity gradient (:func:`rlq.quant.tensor.straight_through`,
    no copy), as the parent's.

    Above a block-circulant layer (``expansion``, set by :func:`stack_fake_quant_`) a miss quantizes the B
    times smaller B-vectors and expands the result: the B rows of a block row hold the same values as
    its vectors, so a per-output-channel (or per-tensor) scale is the same number and every entry the
    same function of the same value; the expansion copies bits.
    """

    def __init__(self, bits: int, axis: int | None = 0, layer_name: str | None = None):
        super().__init__(bits, axis, layer_name)
        self.memo = TensorMemo()
        self._memo_settings: tuple[int, int | None] | None = None
        self.expansion: ExpansionCache | None = None  # the block-circulant expansion beneath, if any
        # (B-vectors snapshot of the expansion cache, quantized dense weight, its version)
        self._by_vectors: tuple[torch.Tensor, torch.Tensor, int] | None = None

    def __getstate__(self) -> dict:
        state = dict(super().__getstate__())
        state["_by_vectors"] = None  # a copy's expansion cache starts empty: nothing to match
        return state

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        """Return the fake-quantized weight (straight-through gradient), reused while ``weight`` is unchanged."""
        if not self.enabled or not self.memo.accepts(weight):
            return super().forward(weight)
        settings = (self.bits, self.axis)
        if self._memo_settings != settings:
            self.memo.clear()
            self._by_vectors = None
            self._memo_settings = settings
        vectors = self._vectors_beneath(weight)
        if vectors is not None:
            quantized = self._quantized_from_vectors(vectors)
        else:
            quantized = self.memo.get(weight)
            if quantized is None:
                out = super().forward(weight)
                self.memo.put(weight, out.detach())
                return out
        return straight_through(weight, quantized)

    def _vectors_beneath(self, weight: torch.Tensor) -> torch.Tensor | None:
        """Return the B-vectors ``weight`` is the cached expansion of, or None (no such layer, or another axis)."""
        if self.expansion is None or self.axis not in (0, None):
            return None
        return self.expansion.vectors_of(weight)

    def _quantized_from_vectors(self, vectors: torch.Tensor) -> torch.Tensor:
        """Return the parent's (no-grad) output for the expansion of ``vectors``, computed from the vectors."""
        stored = self._by_vectors
        # the expansion cache's snapshot is private and never written: its identity names its bits
        if stored is not None and stored[0] is vectors and stored[1]._version == stored[2]:
            return stored[1]
        # the parent's no-grad output of the vectors is q(v) + 0.0, as of the dense weight; expanding copies bits
        with torch.no_grad():
            quantized = expand_circulant(super().forward(vectors))
        self._by_vectors = (vectors, quantized, quantized._version)
        return quantized


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


def _fake_quant_on_top(layer: nn.Module) -> list[WeightFakeQuant]:
    """Return the QAT quantizers of ``layer.weight``, checked to sit above every other parametrization."""
    if not parametrize.is_parametrized(layer, "weight"):
        return []
    stack = list(layer.parametrizations["weight"])
    quantizers = [p for p in stack if isinstance(p, WeightFakeQuant)]
    if quantizers and not all(isinstance(p, WeightFakeQuant) for p in stack[len(stack) - len(quantizers) :]):
        raise ValueError("QAT's fake quantization must be the last parametrization of the weight")
    return quantizers


def lift_fake_quant_(layer: nn.Module) -> list[WeightFakeQuant]:
    """Return the QAT quantizers taken off ``layer.weight`` in place; its compression and values stay as stored.

    The stored Parameter (dense weight or B-vectors) keeps its identity; a mask that sat beneath QAT on the
    parametrization's ``original`` moves back onto the layer's own ``weight`` (``torch.nn.utils.prune``).
    """
    quantizers = _fake_quant_on_top(layer)
    if not quantizers:
        return []
    plist = layer.parametrizations["weight"]
    if len(quantizers) == len(plist):  # QAT alone: the weight becomes the plain (maybe pruned) Parameter
        mask = bake_mask_(plist, "original")
        remove_parametrizations_(layer, "weight", leave_parametrized=False)
        if mask is not None:
            prune_with_mask_(layer, "weight", mask)
    else:  # block-circulant below: only the top of the stack goes
        for _ in quantizers:
            del plist[len(plist) - 1]
    return quantizers


def stack_fake_quant_(layer: nn.Module, quantizers: list[WeightFakeQuant]) -> None:
    """Put QAT ``quantizers`` on top of ``layer.weight``'s compression in place (see the module docstring).

    A pruned dense weight's mask moves onto the parametrization's ``original``, beneath the quantizers, so
    QAT quantizes the unpruned values and the zeros stay exact (symmetric quantization maps 0 to 0). A
    block-circulant layer keeps the dense forward path, the only one that sees the quantized weight.
    """
    if not quantizers:
        return
    mask = None
    if not parametrize.is_parametrized(layer, "weight"):
        mask = bake_mask_(layer, "weight")
    elif is_block_circulant(layer):
        set_forward_path_(layer, "dense")
    expansion = expansion_cache_of(layer)
    for position, quantizer in enumerate(quantizers):
        if isinstance(quantizer, MemoizedWeightFakeQuant):  # only the first sees the expansion
            quantizer.expansion = expansion if position == 0 else None
        parametrize.register_parametrization(layer, "weight", quantizer)
    if mask is not None:
        prune_with_mask_(layer.parametrizations["weight"], "original", mask)


@contextmanager
def fake_quant_lifted(policy: nn.Module) -> Iterator[int]:
    """Lift every QAT weight quantizer off ``policy`` inside the block and stack it back after; yield their count.

    The compression callbacks change structure inside it (:meth:`rlq.sb3.compression.CompressionCallback.\
    _changing_structure`), so block-circulant layers, transitions, the hand-over and pruning act on the
    float (latent) model exactly as without QAT, and the same quantizer objects return on top afterwards.
    """
    lifted = [(layer, lift_fake_quant_(layer)) for layer in list(policy.modules())]
    lifted = [(layer, quantizers) for layer, quantizers in lifted if quantizers]
    try:
        yield len(lifted)
    finally:
        for layer, quantizers in lifted:
            stack_fake_quant_(layer, quantizers)


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
    pruned) gets the quantizer on top of its compression (:func:`stack_fake_quant_`); quantizers are
    :class:`MemoizedWeightFakeQuant`, which quantize each weight once per value it takes. Optimizer states are
    refreshed (:func:`rlq.sb3.networks.refresh_optimizers`); the Parameter objects stay the same, so the
    optimizers keep training them.
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


class QATCallback(BaseCallback):
    """Quantization-aware training for any SB3 algorithm (A2C, PPO, DQN, TD3, DDPG, SAC), with a quantization delay.

    QuaRL: https://arxiv.org/abs/1910.01055 (section 4.2).

    At the start of training every Linear and convolution weight of every network of the policy (actor,
    critic, Q-network and their targets) gets ``bits``-bit fake quantization with a straight-through
    estimator. QuaRL's QAT rewrote the whole TensorFlow graph, so all layers are quantized by default,
    first and last included; ``skip_first_last=True`` leaves the first and last layer of each network in
    float (the common practice for very low bit widths). Quantization stays off until
    ``model.num_timesteps`` reaches ``delay_steps`` (counted from the model's first step, so a resumed run
    keeps the same schedule), then on until the end. At the end of training (``convert_at_end``) the
    quantized weights are baked in: each weight tensor of the policy then takes at most ``2^bits`` values
    (per output channel with ``per_channel``, per tensor otherwise).

    :param bits: bits per weight (2..16).
    :param delay_steps: environment steps of float training before fake quantization switches on
        (QuaRL's recipe: half of training).
    :param activations: also fake-quantize the input of every quantized layer (asymmetric, ``bits`` bits,
        ranges tracked by a moving average that keeps observing during the delay).
    :param per_channel: one scale per output channel (True) or per weight tensor (False).
    :param convert_at_end: bake the quantized weights in when ``learn`` returns; keep False to continue QAT
        over several ``learn`` calls.
    :param skip_first_last: leave the first and last layer of each network unquantized.
    :param networks: ``"all"`` (QuaRL: actor, critics and targets) or ``"action_path"``: only the layers the
        deployed policy runs and their target twins (:func:`qat_layers`). Critics are never shipped, and
        fake-quantizing them costs most of QAT's training time in off-policy algorithms (TD3 evaluates its
        twin critics and their targets several times a step).

    ``history`` holds one ``{"step", "enabled"}`` entry when training starts and one when quantization
    switches on; ``layers`` the names of the quantized layers.
    """

    def __init__(
        self,
        bits: int,
        delay_steps: int = 0,
        activations: bool = False,
        per_channel: bool = True,
        convert_at_end: bool = True,
        skip_first_last: bool = False,
        networks: str = "all",
    ):
        super().__init__()
        self.networks = check_qat_networks(networks)
        self.bits = check_bits(bits)
        self.delay_steps = check_non_negative_int("delay_steps", delay_steps)
        self.activations = bool(activations)
        self.per_channel = bool(per_channel)
        self.convert_at_end = bool(convert_at_end)
        self.skip_first_last = bool(skip_first_last)
        self.enabled = False
        self.history: list[dict[str, Any]] = []
        self.layers: list[str] = []

    def _set_enabled(self, enabled: bool) -> None:
        set_qat_enabled(self.model.policy, enabled)
        self.enabled = enabled
        self.history.append({"step": int(self.num_timesteps), "enabled": enabled})
        log.info("QAT %s at step %d (%d bits)", "on" if enabled else "off", self.num_timesteps, self.bits)

    def _on_training_start(self) -> None:
        policy = self.model.policy
        if is_qat(policy):  # continued training, or a model from load_qat
            layers = {name: m for name, m in policy.named_modules() if _fake_quant_on_top(m)}
            found = {q.bits for q in weight_quantizers(policy)}
            if found != {self.bits}:
                raise ValueError(
                    f"the policy is already prepared for QAT at {sorted(found)} bits, not {self.bits}; "
                    "convert it (rlq.sb3.qat_callback.convert_policy_qat_) or start from a float model"
                )
            for layer in layers.values():
                _install_state_dict_hooks(layer)
            self.layers = list(layers)
        else:
            self.layers = prepare_policy_qat_(
                policy, self.bits, self.activations, self.per_channel, self.skip_first_last, self.networks
            )
        self._set_enabled(self.num_timesteps >= self.delay_steps)

    def _on_step(self) -> bool:
        if not self.enabled and self.num_timesteps >= self.delay_steps:
            self._set_enabled(True)
        self.logger.record("qat/bits", self.bits)
        self.logger.record("qat/active", int(self.enabled))
        return True

    def _on_training_end(self) -> None:
        if self.convert_at_end and is_qat(self.model.policy):
            convert_policy_qat_(self.model.policy)


__all__ = [
    "MemoizedWeightFakeQuant",
    "QATCallback",
    "check_qat_networks",
    "convert_policy_qat_",
    "fake_quant_lifted",
    "lift_fake_quant_",
    "prepare_policy_qat_",
    "QAT_NETWORKS",
    "qat_layers",
    "stack_fake_quant_",
]
