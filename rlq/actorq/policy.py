"""The acting network that travels from learner to actors: its architecture, its weights, a torch copy.

The learner's SB3 actor holds more than acting needs (target networks, optimizers, distributions). What
is broadcast is only the MLP that maps an observation to an action: for TD3 and DDPG ``tanh(mu(h))``, for
SAC the mean and log-std heads of its squashed Gaussian. Its weights are a flat ``{name: array}`` dict
with names ``layers.<i>.weight`` / ``.bias`` (hidden layers), ``mu.*`` and, for SAC, ``log_std.*``.

A block-circulant policy (:func:`block_circulant_policy_`, the learner's ``policy_block_size``) trains its
hidden-to-hidden layers as B-vectors in fp32, as GST does; :func:`policy_weights` gives those layers'
B-vectors ``(out/B, in/B, B)``, not their dense expansion, so that the broadcast carries them alone.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from rlq.actorq.architecture import LOG_STD_MAX, LOG_STD_MIN, PolicyArchitecture
from rlq.compress import block_size_of, circulant_vectors, make_block_circulant_

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
    sizes = {block_size_of(layer) for layer in hidden[1:]}
    if block_size_of(hidden[0]) is not None or len(sizes) > 1:
        raise TypeError(
            "ActorQ broadcasts policies whose hidden-to-hidden layers are all block-circulant with one B, or none"
        )
    return PolicyArchitecture(
        obs_dim=int(np.prod(model.observation_space.shape)),
        act_dim=act_dim,
        hidden_sizes=tuple(layer.out_features for layer in hidden),
        activation=_activation_name(actor),
        stochastic=stochastic,
        action_low=tuple(float(v) for v in np.asarray(space.low).reshape(-1)),
        action_high=tuple(float(v) for v in np.asarray(space.high).reshape(-1)),
        block_size=next(iter(sizes), None),
    )


def _named_layers(actor: nn.Module) -> dict[str, nn.Linear]:
    """Return the acting network's Linear layers of an SB3 actor by their broadcast names, in forward order."""
    if hasattr(actor, "latent_pi"):
        hidden, heads = _linears(actor.latent_pi), {"mu": actor.mu, "log_std": actor.log_std}
    else:
        linears = _linears(actor.mu)
        hidden, heads = linears[:-1], {"mu": linears[-1]}
    return {f"layers.{i}": layer for i, layer in enumerate(hidden)} | heads


def policy_weights(model) -> dict[str, np.ndarray]:
    """Return the acting network's current fp32 weights ``{name: array}``, copied from an SB3 model's actor.

    A block-circulant layer gives its B-vectors ``(out/B, in/B, B)`` (its pruning mask applied), not the
    dense expansion.
    """
    out: dict[str, np.ndarray] = {}
    with torch.no_grad():
        for prefix, layer in _named_layers(model.policy.actor).items():
            weight = circulant_vectors(layer) if block_size_of(layer) is not None else layer.weight
            out[f"{prefix}.weight"] = weight.detach().to("cpu", torch.float32).numpy().copy()
            out[f"{prefix}.bias"] = layer.bias.detach().to("cpu", torch.float32).numpy().copy()
    return out


def block_circulant_policy_(model, block_size: int) -> list[str]:
    """Return the names of the layers made block-circulant in an SB3 model's policy (and its target), in place.

    The hidden-to-hidden layers (``layers.1`` on) get B-vectors of block size ``block_size``, set from the
    current weights by :func:`rlq.compress.make_block_circulant_` with ``init="scaled"`` (a fresh
    initialisation keeps its entry std); the first layer and the heads stay dense, and the critic too. The
    target policy (TD3, DDPG, D4PG) gets the same structure and the online policy's values. Call it before the
    first gradient step: Parameter objects are kept, so the actor's optimizer still holds them.
    """
    actor = model.policy.actor
    target = getattr(model.policy, "actor_target", None)
    names = [name for name in _named_layers(actor) if name.startswith("layers.")][1:]
    for net in (actor, target):
        if net is None:
            continue
        layers = _named_layers(net)
        for name in names:
            make_block_circulant_(layers[name], block_size, init="scaled")
    if target is not None:
        target.load_state_dict(actor.state_dict())
    return names


def acting_sequential(arch: PolicyArchitecture, weights: dict[str, np.ndarray]) -> nn.Sequential:
    """Return the acting network as an ``nn.Sequential`` of ``weights`` (B-vectors as rlq block-circulant layers).

    Its output is the deterministic policy's action in [-1, 1], or SAC's mean and raw log-std side by side
    (``2 * act_dim`` values, one Linear holding both heads; the log-std clamp is left to the caller). It is
    what :func:`rlq.deploy.compile_policy` reads, and the reference a compiled actor is checked against.
    """
    sizes = (arch.obs_dim, *arch.hidden_sizes)
    modules: list[nn.Module] = []
    with torch.no_grad(), torch.random.fork_rng():  # every value is overwritten: draw nothing
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            layer = nn.Linear(n_in, n_out)
            weight = np.asarray(weights[f"layers.{i}.weight"], dtype=np.float32)
            if weight.ndim == 3:
                make_block_circulant_(layer, int(weight.shape[2]))
                layer.parametrizations.weight.original.copy_(torch.from_numpy(weight))
            else:
                layer.weight.copy_(torch.from_numpy(weight))
            layer.bias.copy_(torch.from_numpy(np.asarray(weights[f"layers.{i}.bias"], dtype=np.float32)))
            modules += [layer, ACTIVATIONS[arch.activation]()]
        heads = ["mu", "log_std"] if arch.stochastic else ["mu"]
        head = nn.Linear(sizes[-1], arch.act_dim * len(heads))
        head.weight.copy_(
            torch.from_numpy(np.concatenate([weights[f"{h}.weight"] for h in heads]).astype(np.float32))
        )
        head.bias.copy_(
            torch.from_numpy(np.concatenate([weights[f"{h}.bias"] for h in heads]).astype(np.float32))
        )
        modules.append(head)
        if not arch.stochastic:
            modules.append(nn.Tanh())
    return nn.Sequential(*modules)
