"""Which layers an SB3 policy holds, in forward order per network, and the optimizers that train them.

SB3's collections of layers are not positional (a critic holds two Q-networks, PPO's action head sits
outside its MLP), so "first and last layer" has to be found per network. A *chain* is the list of weight
layers one input passes through to one output; the layers GST and QAT skip by default are those that are
the first or the last of some chain.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TypeVar

import torch
from torch import nn

WEIGHT_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
T = TypeVar("T")


def weight_layers(module: nn.Module | None) -> list[nn.Module]:
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
            weight_layers(policy.pi_features_extractor)
            + weight_layers(extractor.policy_net)
            + [policy.action_net]
        )
        chains["critic"] = (
            weight_layers(policy.vf_features_extractor)
            + weight_layers(extractor.value_net)
            + [policy.value_net]
        )
    elif isinstance(policy, DQNPolicy):
        for name in ("q_net", "q_net_target"):
            q = getattr(policy, name)
            chains[name] = weight_layers(q.features_extractor) + weight_layers(q.q_net)
    elif isinstance(policy, (TD3Policy, SACPolicy)):  # TD3, DDPG, SAC
        for name in ("actor", "actor_target"):
            actor = getattr(policy, name, None)
            if actor is None:
                continue  # SAC has no actor target
            trunk = weight_layers(actor.features_extractor)
            if hasattr(actor, "latent_pi"):  # SAC: a trunk and two heads
                trunk += weight_layers(actor.latent_pi)
                chains[name] = trunk + [actor.mu]
                if isinstance(actor.log_std, nn.Module):
                    chains[f"{name}.log_std"] = trunk + weight_layers(actor.log_std)
            else:
                chains[name] = trunk + weight_layers(actor.mu)
        for name in ("critic", "critic_target"):
            critic = getattr(policy, name)
            for i, q in enumerate(critic.q_networks):
                chains[f"{name}.q{i}"] = weight_layers(critic.features_extractor) + weight_layers(q)
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
