"""Quantization-aware training (QAT) of any Stable-Baselines3 model, as a callback.

QuaRL (Krishnan et al., arXiv 1910.01055, section 4.2) trains with n-bit fake quantization and a straight-through
estimator after a *quantization delay* (half of training in the public recipe), whose public code inserts no
fake quantization; :class:`QATCallback` registers :class:`rlq.quant.WeightFakeQuant` on the weights of every
network of the policy, and the tests check that the forward pass really changes once the delay has passed.

Usage::

    model = PPO("MlpPolicy", "CartPole-v1")
    model.learn(100_000, callback=QATCallback(bits=4, delay_steps=50_000))
    # the policy is now converted: each weight tensor holds at most 2^4 distinct values (per output channel)

The callback holds the schedule (the delay, then on until the end, then conversion); what it does to the
policy is :mod:`rlq.sb3.qat_policy` (which layers, preparation, saving, conversion). Training together with
compression, ``model.learn(n, callback=[QATCallback(...), GSTCallback(...)])`` (or with
:class:`rlq.sb3.pruning_callback.GradualPruningCallback`, in either order) trains a policy that is sparse and
low-bit at once: QAT quantizes what the compression stores (:mod:`rlq.sb3.qat_stacking`).
"""

from __future__ import annotations

import logging
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback

from rlq.core.validation import check_non_negative_int
from rlq.quant import is_qat, set_qat_enabled
from rlq.quant.qat import weight_quantizers
from rlq.quant.tensor import check_bits
from rlq.sb3.qat_policy import (
    _install_state_dict_hooks,
    check_qat_networks,
    convert_policy_qat_,
    prepare_policy_qat_,
)
from rlq.sb3.qat_stacking import _fake_quant_on_top

log = logging.getLogger(__name__)


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
        deployed policy runs and their target twins (:func:`rlq.sb3.qat_policy.qat_layers`). Critics are
        never shipped, and fake-quantizing them costs most of QAT's training time in off-policy algorithms
        (TD3 evaluates its twin critics and their targets several times a step).

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
                    "convert it (rlq.sb3.qat_policy.convert_policy_qat_) or start from a float model"
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


__all__ = ["QATCallback"]
