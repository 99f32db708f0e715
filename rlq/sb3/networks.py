"""Which layers an SB3 policy holds, in forward order per network, and the optimizers that train them.

SB3's collections of layers are not positional (a critic holds two Q-networks, PPO's action head sits
outside its MLP), so "first and last layer" has to be found per network. A *chain* is the list of weight
layers one input passes through to one output; the layers GST and QAT skip by default are those that are
the first or the last of some chain.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from rlq.compress import layer_report
from rlq.compress.layers import dense_weight_numel

WEIGHT_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
T = TypeVar("T")


def _weight_layers_of(module: nn.Module | None) -> list[nn.Module]:
    """Return the Linear/Conv layers of ``module`` in definition (forward) order."""
    return [] if module is None else [m for m in module.modules() if isinstance(m, WEIGHT_LAYERS)]


def layer_chains(policy: nn.Module) -> dict[str, list[nn.Module]]:
    """Return each network of an SB3 policy as a named chain of its weight layers, targets included."""
    from stable_baselines3.common.policies import ActorCriticPolicy
    from stable_baselines3.dqn.policies import DQNPolicy
    from stable_baselines3.sac.policies import SACPolicy
    from stable_baselines3.td3.policies import TD3Policy

    chains: dict[str, list[nn.Module]] = {}
    if isinstance(policy, ActorCriticPolicy):  # A2C, PPO
        extractor = policy.mlp_extractor
        chains["actor"] = (
            _weight_layers_of(policy.pi_features_extractor)
            + _weight_layers_of(extractor.policy_net)
            + [policy.action_net]
        )
        chains["critic"] = (
            _weight_layers_of(policy.vf_features_extractor)
            + _weight_layers_of(extractor.value_net)
            + [policy.value_net]
        )
    elif isinstance(policy, DQNPolicy):
        for name in ("q_net", "q_net_target"):
            q = getattr(policy, name)
            chains[name] = _weight_layers_of(q.features_extractor) + _weight_layers_of(q.q_net)
    elif isinstance(policy, (TD3Policy, SACPolicy)):  # TD3, DDPG, SAC
        for name in ("actor", "actor_target"):
            actor = getattr(policy, name, None)
            if actor is None:
                continue  # SAC has no actor target
            trunk = _weight_layers_of(actor.features_extractor)
            if hasattr(actor, "latent_pi"):  # SAC: a trunk and two heads
                trunk += _weight_layers_of(actor.latent_pi)
                chains[name] = trunk + [actor.mu]
                if isinstance(actor.log_std, nn.Module):
                    chains[f"{name}.log_std"] = trunk + _weight_layers_of(actor.log_std)
            else:
                chains[name] = trunk + _weight_layers_of(actor.mu)
        for name in ("critic", "critic_target"):
            critic = getattr(policy, name)
            for i, q in enumerate(critic.q_networks):
                chains[f"{name}.q{i}"] = _weight_layers_of(critic.features_extractor) + _weight_layers_of(q)
    else:
        raise TypeError(
            f"rlq does not know the layout of {type(policy).__name__}; supported: the policies of "
            "A2C, PPO, DQN, TD3, DDPG and SAC"
        )
    return chains


def chain_ends(chains: Mapping[str, Sequence[T]]) -> dict[T, str]:
    """Return every layer that is the first or the last of some chain, with why it stays dense.

    Layers are modules or names; a layer that ends several chains keeps the reason of the first one.
    """
    ends: dict[T, str] = {}
    for chain_name, layers in chains.items():
        if layers:
            ends.setdefault(layers[0], f"first layer of chain {chain_name!r} (kept dense)")
            ends.setdefault(layers[-1], f"last layer of chain {chain_name!r} (kept dense)")
    return ends


def named_layers(policy: nn.Module, skip_first_last: bool = True) -> dict[str, nn.Module]:
    """Return ``{qualified name: layer}`` of the policy's weight layers, without chain ends if asked."""
    chains = layer_chains(policy)
    ends = chain_ends(chains) if skip_first_last else {}
    wanted = {layer for chain in chains.values() for layer in chain if layer not in ends}
    return {name: m for name, m in policy.named_modules() if m in wanted}


def target_pairs(policy: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
    """Return ``(online, target)`` network pairs whose compression must stay identical."""
    pairs = []
    for online, target in (("actor", "actor_target"), ("critic", "critic_target"), ("q_net", "q_net_target")):
        if getattr(policy, online, None) is not None and getattr(policy, target, None) is not None:
            pairs.append((getattr(policy, online), getattr(policy, target)))
    return pairs


def optimizers(policy: nn.Module) -> list[torch.optim.Optimizer]:
    """Return every optimizer held by the policy's modules (PPO: one; TD3/SAC: actor and critic)."""
    found: dict[int, torch.optim.Optimizer] = {}
    for module in policy.modules():
        opt = getattr(module, "optimizer", None)
        if isinstance(opt, torch.optim.Optimizer):
            found.setdefault(id(opt), opt)
    return list(found.values())


def _live_parameters(module: nn.Module) -> Iterator[nn.Parameter]:
    return (p for p in module.parameters() if p.requires_grad)


def refresh_optimizers(policy: nn.Module) -> int:
    """Return how many optimizer states were dropped after a structural change of the policy's layers.

    Parametrizations keep their Parameter objects but may change their shape (dense weights become
    B-vectors): an Adam state of the old shape would break the next step, so it is reset. Parameters no
    longer in the policy are removed from the optimizer's groups.
    """
    live = {id(p) for p in _live_parameters(policy)}
    dropped = 0
    for opt in optimizers(policy):
        for group in opt.param_groups:
            group["params"] = [p for p in group["params"] if id(p) in live]
        for p in list(opt.state):
            state = opt.state[p]
            stale = id(p) not in live or any(
                torch.is_tensor(v) and v.dim() > 0 and v.shape != p.shape for v in state.values()
            )
            if stale:
                del opt.state[p]
                dropped += 1
    return dropped


def copy_policy(policy: nn.Module) -> nn.Module:
    """Return an independent copy of an SB3 policy in eval mode, compression structure included.

    ``copy.deepcopy`` fails on a policy that has acted with gradients on (SB3 keeps the last action
    distribution, a non-leaf tensor), so the copy is rebuilt from the policy's constructor arguments and
    its state dict, block-circulant and pruned layers re-created as the keys say.
    """
    from rlq.compress import load_compressed_state_dict_

    fresh = type(policy)(**policy._get_constructor_parameters())
    load_compressed_state_dict_(fresh, policy.state_dict())
    fresh.to(policy.device)
    fresh.set_training_mode(False)
    return fresh


# --------------------------------------------------------------------------------------------------------
# Which layers of an SB3 policy the compression callbacks touch, and their target twins


@dataclass
class PolicyLayers:
    """The layers of an SB3 policy that the callbacks see: online networks, eligible layers, target twins."""

    online: dict[str, nn.Module]
    """Every weight layer of an online chain, by qualified name, in chain order."""
    chains: dict[str, list[str]]
    """Online chains (``layer_chains`` names) as lists of layer names in forward order."""
    eligible: list[str]
    """Layers the compression touches."""
    reasons: dict[str, str]
    """Why each other online layer stays dense."""
    targets: dict[str, nn.Module]
    """Online layer name -> the same layer of its target network (only for networks with a target)."""
    target_chains: dict[str, list[nn.Module]]
    """Online chain name -> the target network's chain, layer by layer (only for networks with a target)."""
    online_weights: dict[str, nn.Module]
    """Every Linear/Conv layer of the online networks, by name: what the compression ratio counts."""

    @property
    def weight_names(self) -> list[str]:
        """Return the names of the online networks' Linear/Conv layers."""
        return list(self.online_weights)

    def covered_fraction_of(self, names: Sequence[str]) -> float:
        """Return the share of the online networks' weights held by the layers ``names``."""
        total = sum(dense_weight_numel(layer) for layer in self.online_weights.values())
        wanted = set(names)
        covered = sum(dense_weight_numel(layer) for n, layer in self.online_weights.items() if n in wanted)
        return covered / total if total else 0.0

    @property
    def covered_fraction(self) -> float:
        """Return the share of the online networks' weights held by eligible layers (paper: 94-99%)."""
        return self.covered_fraction_of(self.eligible)


def _module_names(policy: nn.Module) -> dict[int, str]:
    names: dict[int, str] = {}
    for name, module in policy.named_modules():
        names.setdefault(id(module), name)
    return names


def policy_layers(policy: nn.Module, skip_first_last: bool = True) -> PolicyLayers:
    """Return the online layers, eligible layers and target twins of an SB3 policy (see the module doc)."""
    names = _module_names(policy)
    pairs = [(names[id(o)], names[id(t)]) for o, t in target_pairs(policy)]
    target_prefixes = tuple(f"{t}." for _, t in pairs)

    def is_target(name: str) -> bool:
        return name.startswith(target_prefixes)

    chains: dict[str, list[str]] = {}
    for chain_name, layers in layer_chains(policy).items():
        layer_names = [names[id(m)] for m in layers]
        if layer_names and not is_target(layer_names[0]):
            chains[chain_name] = layer_names
    modules = dict(policy.named_modules())
    online: dict[str, nn.Module] = {}
    for layer_names in chains.values():
        for name in layer_names:
            online.setdefault(name, modules[name])
    ends = chain_ends(chains) if skip_first_last else {}
    eligible = [name for name in online if name not in ends]
    twin_of = {}
    for online_prefix, target_prefix in pairs:
        for name in online:
            if name.startswith(f"{online_prefix}."):
                twin = target_prefix + name[len(online_prefix) :]
                if twin not in modules:
                    raise RuntimeError(f"target network has no layer {twin!r} matching {name!r}")
                twin_of[name] = twin
    targets = {name: modules[twin] for name, twin in twin_of.items()}
    target_chains = {
        chain_name: [targets[n] for n in layer_names]
        for chain_name, layer_names in chains.items()
        if all(n in targets for n in layer_names)
    }
    weights = {
        row["name"]: modules[row["name"]] for row in layer_report(policy) if not is_target(row["name"])
    }
    return PolicyLayers(online, chains, eligible, dict(ends), targets, target_chains, weights)


def check_exact_transitions(layers: PolicyLayers) -> None:
    """Raise ValueError, saying why, when the exact block-size transition cannot apply to these networks.

    The exact split reorders hidden units, so each network must be a plain chain: no layer shared by two
    chains (SAC's actor trunk feeds ``mu`` and ``log_std``; a CNN may feed actor and critic), each layer's
    outputs the next layer's inputs (no flatten from channels to features), and the first and last layers
    dense. Use ``transition_method="projection"`` otherwise.
    """
    seen: dict[str, str] = {}
    for chain_name, names in layers.chains.items():
        for name in names:
            if name in seen:
                raise ValueError(
                    f"exact transitions need non-overlapping chains, but layer {name!r} is in chains "
                    f"{seen[name]!r} and {chain_name!r} (a shared trunk); use transition_method='projection'"
                )
            seen[name] = chain_name
    eligible = set(layers.eligible)
    for chain_name, names in layers.chains.items():
        if names[0] in eligible or names[-1] in eligible:
            raise ValueError(
                f"exact transitions keep each chain's first and last layer dense, but chain {chain_name!r} "
                "compresses them (skip_first_last=False); use transition_method='projection'"
            )
        for a, b in zip(names[:-1], names[1:], strict=True):
            out_units = _units(layers.online[a])[0]
            in_units = _units(layers.online[b])[1]
            if out_units != in_units and (a in eligible or b in eligible):
                raise ValueError(
                    f"exact transitions need plain chains, but in chain {chain_name!r} layer {a!r} has "
                    f"{out_units} outputs and {b!r} {in_units} inputs; use transition_method='projection'"
                )


def _units(layer: nn.Module) -> tuple[int, int]:
    if isinstance(layer, nn.Linear):
        return layer.out_features, layer.in_features
    return layer.out_channels, layer.in_channels


# --------------------------------------------------------------------------------------------------------
