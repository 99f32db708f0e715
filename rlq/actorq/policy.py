"""The acting network that travels from learner to actors: its architecture, its weights, a torch copy.

The learner's SB3 actor holds more than acting needs (target networks, optimizers, distributions). What
is broadcast is only the MLP that maps an observation to an action: for TD3 and DDPG ``tanh(mu(h))``, for
SAC the mean and log-std heads of its squashed Gaussian. Its weights are a flat ``{name: array}`` dict
with names ``layers.<i>.weight`` / ``.bias`` (hidden layers), ``mu.*`` and, for SAC, ``log_std.*``.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from rlq.actorq.architecture import LOG_STD_MAX, LOG_STD_MIN, PolicyArchitecture

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh}


class PolicyNet(nn.Module):
    """The acting MLP in PyTorch: ``forward(obs)`` gives the action in [-1, 1] (or SAC's mean and log-std)."""

    def __init__(self, arch: PolicyArchitecture):
        super().__init__()
        self.arch = arch
        sizes = (arch.obs_dim, *arch.hidden_sizes)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True))
        self.activation = ACTIVATIONS[arch.activation]()
        self.mu = nn.Linear(sizes[-1], arch.act_dim)
        self.log_std = nn.Linear(sizes[-1], arch.act_dim) if arch.stochastic else None

    def forward(self, obs: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        h = obs
        for layer in self.layers:
            h = self.activation(layer(h))
        if self.log_std is None:
            return torch.tanh(self.mu(h))
        return self.mu(h), torch.clamp(self.log_std(h), LOG_STD_MIN, LOG_STD_MAX)

    def load_arrays(self, weights: dict[str, np.ndarray]) -> PolicyNet:
        """Return self after copying float weights ``{name: array}`` into its parameters."""
        with warnings.catch_warnings():
            # Arrays pulled from Ray's object store are read-only; load_state_dict only reads them (and copies).
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            state = {k: torch.as_tensor(np.asarray(v, dtype=np.float32)) for k, v in weights.items()}
        self.load_state_dict(state, strict=True)
        return self


def _linears(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def _activation_name(actor: nn.Module) -> str:
    fn = getattr(actor, "activation_fn", nn.ReLU)
    for name, cls in ACTIVATIONS.items():
        if fn is cls:
            return name
    raise TypeError(f"ActorQ policies use ReLU or Tanh hidden activations, this actor uses {fn.__name__}")


def _check_extractor(actor: nn.Module) -> None:
    from stable_baselines3.common.torch_layers import FlattenExtractor

    if not isinstance(actor.features_extractor, FlattenExtractor):
        raise TypeError(
            f"ActorQ broadcasts MLP policies on flat observations; this actor has a "
            f"{type(actor.features_extractor).__name__} features extractor"
        )


def architecture_of(model) -> PolicyArchitecture:
    """Return the :class:`PolicyArchitecture` of an SB3 TD3, DDPG or SAC model's actor."""
    actor = model.policy.actor
    _check_extractor(actor)
    space = model.action_space
    stochastic = hasattr(actor, "latent_pi")
    if stochastic and getattr(actor, "use_sde", False):
        raise TypeError("ActorQ does not support SAC with gSDE exploration (use_sde=True)")
    hidden = _linears(actor.latent_pi) if stochastic else _linears(actor.mu)[:-1]
    act_dim = int(np.prod(space.shape))
    return PolicyArchitecture(
        obs_dim=int(np.prod(model.observation_space.shape)),
        act_dim=act_dim,
        hidden_sizes=tuple(layer.out_features for layer in hidden),
        activation=_activation_name(actor),
        stochastic=stochastic,
        action_low=tuple(float(v) for v in np.asarray(space.low).reshape(-1)),
        action_high=tuple(float(v) for v in np.asarray(space.high).reshape(-1)),
    )


def policy_weights(model) -> dict[str, np.ndarray]:
    """Return the acting network's current fp32 weights ``{name: array}``, copied from an SB3 model's actor."""
    actor = model.policy.actor
    stochastic = hasattr(actor, "latent_pi")
    if stochastic:
        hidden, heads = _linears(actor.latent_pi), {"mu": actor.mu, "log_std": actor.log_std}
    else:
        linears = _linears(actor.mu)
        hidden, heads = linears[:-1], {"mu": linears[-1]}
    named = {f"layers.{i}": layer for i, layer in enumerate(hidden)} | heads
    out: dict[str, np.ndarray] = {}
    with torch.no_grad():
        for prefix, layer in named.items():
            out[f"{prefix}.weight"] = layer.weight.detach().to("cpu", torch.float32).numpy().copy()
            out[f"{prefix}.bias"] = layer.bias.detach().to("cpu", torch.float32).numpy().copy()
    return out
