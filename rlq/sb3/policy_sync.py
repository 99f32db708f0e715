"""An SB3 policy kept in step with the compression of its online networks: target masks, optimizer state.

The compression callbacks (:class:`rlq.sb3.compression.CompressionCallback` and its subclasses) compress the
online networks; these functions carry each change over to the rest of the policy:

- **Targets.** Target networks (TD3/DDPG ``actor_target`` and ``critic_target``, SAC ``critic_target``,
  DQN ``q_net_target``) get the same structure as their online networks at every change: the same block
  size, the same hidden-unit reordering (exact transitions), and the online network's masks (masks are
  chosen from the online weights only; :func:`mirror_target_masks_`). Targets keep their own values
  (projected, permuted or masked the same way), so polyak averaging continues without a hard update; since
  parameters keep their order and shapes match, ``polyak_update`` stays aligned and pruned target weights
  stay exactly zero.
- **Optimizers.** Every transform keeps Parameter objects, so the optimizers still hold the live
  parameters. After a structural change (block-circulant on, a transition, the hand-over) the optimizer
  state of the parameters the change touched is reset (:func:`reset_policy_optimizers_`), since moments of
  the old shapes or unit order no longer fit (GST's ``optimizer_reset``: ``"changed"`` by default,
  ``"all"`` drops every parameter's); a pruning update keeps it (masked entries get zero gradients). The
  state of masked entries is parked (first moments 0, second moments 1; :func:`park_masked_optimizer_state_`)
  at every mask change, after every reset and every ``park_every`` steps: the weights trained are the same,
  but ``torch.sqrt`` of the zeros Adam would otherwise hold there is 5x slower on CPU (see
  :mod:`rlq.compress.optimizer_state`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rlq.compress import block_size_of, park_masked_state_, reset_optimizer_state_
from rlq.compress.block_circulant import stored_target
from rlq.compress.masks import bake_mask_, mask_of, prune_with_mask_, stored_tensor
from rlq.sb3.networks import PolicyLayers, optimizers, refresh_optimizers


def online_mask(layers: PolicyLayers, name: str) -> torch.Tensor | None:
    """Return the mask on online layer ``name``'s stored values (weights or B-vectors), if pruned."""
    return mask_of(*stored_target(layers.online[name]))


def mirror_target_masks_(layers: PolicyLayers) -> None:
    """Give every target layer its online layer's mask (structure is mirrored by the transforms).

    Raises RuntimeError where a target's block size differs from its online layer's.
    """
    for name, twin in layers.targets.items():
        layer = layers.online[name]
        if block_size_of(layer) != block_size_of(twin):
            raise RuntimeError(
                f"target of {name!r} has block size {block_size_of(twin)}, online {block_size_of(layer)}"
            )
        source, source_name = stored_target(layer)
        dest, dest_name = stored_target(twin)
        mask = mask_of(source, source_name)
        current = mask_of(dest, dest_name)
        if mask is None:
            if current is not None:
                bake_mask_(dest, dest_name)
        elif current is None or not torch.equal(current, mask):
            prune_with_mask_(dest, dest_name, mask.detach().clone())


def park_masked_optimizer_state_(
    policy: nn.Module, layers: PolicyLayers, previous: dict[str, torch.Tensor] | None = None
) -> bool:
    """Park the optimizer state of the eligible layers' masked entries; return whether all of it was there.

    Where a mask regrew entries (``previous``: the masks before the change, by layer name) their state is
    zeroed. Training computes the same weights either way; see :mod:`rlq.compress.optimizer_state` for why.
    Optimizers create state at their first step after a reset, so a False return means: park again later.
    """
    policy_optimizers = optimizers(policy)
    masked = parked = 0
    for name in layers.eligible:
        mask = online_mask(layers, name)
        if mask is None:
            continue
        masked += 1
        param = stored_tensor(*stored_target(layers.online[name]))
        for optimizer in policy_optimizers:
            if park_masked_state_(optimizer, param, mask, (previous or {}).get(name)):
                parked += 1
                break
    return parked == masked


def reset_policy_optimizers_(policy: nn.Module, changed: Sequence[torch.Tensor] | None = None) -> None:
    """Drop the optimizer state of ``changed`` parameters (None: all of the policy's) after a structural change.

    State of another shape than its parameter is dropped in any case
    (:func:`rlq.sb3.networks.refresh_optimizers`).
    """
    for optimizer in optimizers(policy):
        reset_optimizer_state_(optimizer, changed)
    refresh_optimizers(policy)
