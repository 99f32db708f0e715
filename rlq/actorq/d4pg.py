"""D4PG as a Stable-Baselines3 algorithm: a deterministic actor, a distributional critic, n-step returns.

Barth-Maron et al., "Distributed Distributional Deterministic Policy Gradients" (ICLR 2018), the learner of
QuaRL's ActorQ experiments. The critic outputs a categorical distribution over ``n_atoms`` returns evenly
spaced on ``[v_min, v_max]`` (C51, Bellemare et al. 2017); its target is the n-step Bellman update of the
target networks' distribution projected back onto that support (Bellemare et al. 2017, Algorithm 1), and
it is trained by cross-entropy. The actor ascends the critic's mean. N-step returns come from SB3's
``NStepReplayBuffer``. Acting and the policy network are TD3's, so every SB3 tool for TD3 applies.
"""

from __future__ import annotations

from typing import Any

import torch as th
from stable_baselines3 import TD3
from stable_baselines3.common.buffers import NStepReplayBuffer
from stable_baselines3.common.policies import ContinuousCritic
from stable_baselines3.common.preprocessing import get_action_dim
from stable_baselines3.common.torch_layers import create_mlp
from stable_baselines3.common.utils import polyak_update
from stable_baselines3.td3.policies import TD3Policy
from torch import nn
from torch.nn import functional as F


class DistributionalCritic(ContinuousCritic):
    """Q(s, a) as logits over ``n_atoms`` fixed return values (one network; D4PG has no twin critics).

    SB3's :class:`ContinuousCritic` with its ``critic_kwargs`` (``n_critics`` ignored), holding one network
    of ``n_atoms`` outputs in place of the twin one-output networks.
    """

    def __init__(
        self,
        observation_space,
        action_space,
        net_arch: list[int],
        features_extractor: nn.Module,
        features_dim: int,
        *,
        n_atoms: int = 51,
        **critic_kwargs: Any,
    ):
        critic_kwargs["n_critics"] = 0  # no one-output network: the distributional one is made below
        super().__init__(
            observation_space, action_space, net_arch, features_extractor, features_dim, **critic_kwargs
        )
        self.n_critics, self.n_atoms = 1, n_atoms
        activation_fn = critic_kwargs.get("activation_fn", nn.ReLU)
        action_dim = get_action_dim(self.action_space)
        self.q_net = nn.Sequential(*create_mlp(features_dim + action_dim, n_atoms, net_arch, activation_fn))
        self.q_networks = [self.q_net]  # the layout rlq.sb3.networks expects of an SB3 critic

    def forward(self, obs: th.Tensor, actions: th.Tensor) -> th.Tensor:
        with th.set_grad_enabled(not self.share_features_extractor):
            features = self.extract_features(obs, self.features_extractor)
        return self.q_net(th.cat([features, actions], dim=1))


class D4PGPolicy(TD3Policy):
    """TD3's actor with a :class:`DistributionalCritic` of ``n_atoms`` atoms."""

    def __init__(self, *args: Any, n_atoms: int = 51, **kwargs: Any):
        self.n_atoms = n_atoms  # read by make_critic, which TD3Policy's constructor calls
        super().__init__(*args, **kwargs)

    def make_critic(self, features_extractor: nn.Module | None = None) -> DistributionalCritic:
        critic_kwargs = self._update_features_extractor(self.critic_kwargs, features_extractor)
        return DistributionalCritic(**critic_kwargs, n_atoms=self.n_atoms).to(self.device)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        return {**super()._get_constructor_parameters(), "n_atoms": self.n_atoms}


def categorical_projection(
    probs: th.Tensor, rewards: th.Tensor, discounts: th.Tensor, support: th.Tensor
) -> th.Tensor:
    """Return the distribution ``rewards + discounts * Z`` (Z: ``probs`` on ``support``) projected onto ``support``.

    Bellemare et al. 2017, Algorithm 1: each shifted atom's mass goes to its two neighbours on the support in
    proportion to closeness; atoms beyond the ends are clipped to them. ``probs`` is (batch, atoms),
    ``rewards`` and ``discounts`` (batch, 1) (a discount of 0 ends the episode).
    """
    n_atoms = support.numel()
    v_min, v_max = float(support[0]), float(support[-1])
    delta = (v_max - v_min) / (n_atoms - 1)
    shifted = (rewards + discounts * support.view(1, -1)).clamp(v_min, v_max)
    b = (shifted - v_min) / delta
    lower, upper = b.floor().long(), b.ceil().long()
    # An atom landing exactly on the support has lower == upper: give all its mass to one neighbour.
    lower[(upper > 0) & (lower == upper)] -= 1
    upper[(lower < n_atoms - 1) & (lower == upper)] += 1
    projected = th.zeros_like(probs)
    projected.scatter_add_(1, lower, probs * (upper.to(probs.dtype) - b))
    projected.scatter_add_(1, upper, probs * (b - lower.to(probs.dtype)))
    return projected


class D4PG(TD3):
    """D4PG (Barth-Maron et al., ICLR 2018) in SB3: TD3's interface, a distributional critic, n-step returns.

    :param v_min: Smallest return on the critic's support (Acme uses -150 on DeepMind Control).
    :param v_max: Largest return on the critic's support (Acme: 150).
    :param n_atoms: Atoms of the critic's categorical distribution (51, as C51).
    :param n_steps: Steps of the n-step return (Acme's D4PG: 5).
    :param max_grad_norm: Global-norm clipping of each network's gradient before its step (Acme: 40); None: off.
    Other arguments are TD3's; D4PG's defaults differ in ``policy_delay=1`` (actor and critic every step)
    and Gaussian exploration noise supplied by the caller (ActorQ's actors add their own).
    """

    policy_aliases = {"MlpPolicy": D4PGPolicy}

    def __init__(
        self,
        policy: str | type[D4PGPolicy],
        env,
        *,
        v_min: float = -150.0,
        v_max: float = 150.0,
        n_atoms: int = 51,
        n_steps: int = 5,
        max_grad_norm: float | None = None,
        **td3_kwargs: Any,
    ):
        if not v_min < v_max:
            raise ValueError(f"v_min must be below v_max, got {v_min} and {v_max}")
        if n_atoms < 2 or n_steps < 1:
            raise ValueError(f"n_atoms must be >= 2 and n_steps >= 1, got {n_atoms} and {n_steps}")
        self.v_min, self.v_max, self.n_atoms = float(v_min), float(v_max), int(n_atoms)
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        gamma = td3_kwargs.setdefault("gamma", 0.99)
        td3_kwargs.setdefault("policy_delay", 1)
        super().__init__(
            policy,
            env,
            policy_kwargs={**(td3_kwargs.pop("policy_kwargs", None) or {}), "n_atoms": self.n_atoms},
            # Given explicitly (not as TD3's n_steps) so that save/load restores it without a warning.
            replay_buffer_class=NStepReplayBuffer,
            replay_buffer_kwargs={
                **(td3_kwargs.pop("replay_buffer_kwargs", None) or {}),
                "n_steps": int(n_steps),
                "gamma": gamma,
            },
            **td3_kwargs,
        )

    def _clip(self, network: nn.Module) -> None:
        if self.max_grad_norm is not None:
            th.nn.utils.clip_grad_norm_(network.parameters(), self.max_grad_norm)

    @property
    def support(self) -> th.Tensor:
        """Return the critic's atoms: ``n_atoms`` returns evenly spaced on ``[v_min, v_max]``."""
        return th.linspace(self.v_min, self.v_max, self.n_atoms, device=self.device)

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate([self.actor.optimizer, self.critic.optimizer])
        support = self.support
        actor_losses, critic_losses = [], []
        for _ in range(gradient_steps):
            self._n_updates += 1
            data = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)  # type: ignore[union-attr]
            discounts = (
                data.discounts if data.discounts is not None else th.full_like(data.rewards, self.gamma)
            )
            with th.no_grad():
                next_actions = self.actor_target(data.next_observations)
                next_probs = F.softmax(self.critic_target(data.next_observations, next_actions), dim=1)
                target = categorical_projection(
                    next_probs, data.rewards, (1 - data.dones) * discounts, support
                )
            logits = self.critic(data.observations, data.actions)
            critic_loss = -(target * F.log_softmax(logits, dim=1)).sum(dim=1).mean()
            critic_losses.append(critic_loss.item())
            self.critic.optimizer.zero_grad()
            critic_loss.backward()
            self._clip(self.critic)
            self.critic.optimizer.step()

            if self._n_updates % self.policy_delay == 0:
                probs = F.softmax(self.critic(data.observations, self.actor(data.observations)), dim=1)
                actor_loss = -(probs * support).sum(dim=1).mean()
                actor_losses.append(actor_loss.item())
                self.actor.optimizer.zero_grad()
                actor_loss.backward()
                self._clip(self.actor)
                self.actor.optimizer.step()
                polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.tau)
                polyak_update(self.actor.parameters(), self.actor_target.parameters(), self.tau)

        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        if actor_losses:
            self.logger.record("train/actor_loss", sum(actor_losses) / len(actor_losses))
        self.logger.record("train/critic_loss", sum(critic_losses) / len(critic_losses))
