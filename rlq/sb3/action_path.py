"""The action path of a Stable-Baselines3 policy, and SB3's handling of the observations it takes.

The *action path* of an SB3 policy is the modules one observation passes through to the action (features
extractor, actor MLP, action head; for DQN the Q-network). :func:`action_network` returns it as one
``nn.Sequential`` with the kind of output it ends in, and :class:`ObservationPreprocessor` does what SB3's
``predict`` does to an observation before the features extractor. :mod:`rlq.sb3.quantized` quantizes the
one and wraps it, with the other, into a policy whose ``predict`` has SB3's semantics.

The value networks, critics and target networks are not on the action path: acting needs none of them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from gymnasium import spaces
from torch import Tensor

#: How the output of an action network becomes an action.
ARGMAX, MULTI_ARGMAX, BINARY, CONTINUOUS = "argmax", "multi_argmax", "binary", "continuous"


def policy_of(model_or_policy: Any) -> nn.Module:
    """Return the SB3 policy of a model (or the policy itself), or raise TypeError for anything else."""
    from stable_baselines3.common.policies import BasePolicy

    policy = getattr(model_or_policy, "policy", model_or_policy)
    if not isinstance(policy, BasePolicy):
        raise TypeError(f"expected a Stable-Baselines3 model or policy, got {type(model_or_policy).__name__}")
    return policy


def action_network(model_or_policy: Any) -> tuple[nn.Sequential, str]:
    """Return the action path of an SB3 policy as ``(network, output kind)``.

    ``network`` is a new ``nn.Sequential`` over the policy's own modules (shared, not copied: do not train
    or change it; :func:`quantized_policy` quantizes a copy). It maps a *preprocessed* observation batch
    (float, images scaled to [0, 1]) to the output whose ``output kind`` says how it becomes an action:

    - ``"argmax"``: logits (A2C, PPO) or Q-values (DQN) of a ``Discrete`` action space;
    - ``"multi_argmax"`` / ``"binary"``: logits of ``MultiDiscrete`` / ``MultiBinary`` action spaces;
    - ``"continuous"``: the deterministic action: the Gaussian mean (A2C, PPO), ``tanh`` of the mean (SAC,
      gSDE with ``squash_output``), the actor's output (TD3, DDPG).
    """
    from stable_baselines3.common.distributions import (
        BernoulliDistribution,
        CategoricalDistribution,
        DiagGaussianDistribution,
        MultiCategoricalDistribution,
        StateDependentNoiseDistribution,
    )
    from stable_baselines3.common.policies import ActorCriticPolicy
    from stable_baselines3.common.torch_layers import MlpExtractor
    from stable_baselines3.dqn.policies import DQNPolicy
    from stable_baselines3.sac.policies import SACPolicy
    from stable_baselines3.td3.policies import TD3Policy

    policy = policy_of(model_or_policy)
    if isinstance(policy, ActorCriticPolicy):  # A2C, PPO
        if not isinstance(policy.mlp_extractor, MlpExtractor):
            raise TypeError(
                f"custom mlp_extractor {type(policy.mlp_extractor).__name__} is not supported: rlq needs "
                "MlpExtractor's policy_net to build the action path"
            )
        parts = dict(
            features=policy.pi_features_extractor,
            latent=policy.mlp_extractor.policy_net,
            head=policy.action_net,
        )
        dist = policy.action_dist
        if isinstance(dist, CategoricalDistribution):
            kind = ARGMAX
        elif isinstance(dist, MultiCategoricalDistribution):
            kind = MULTI_ARGMAX
        elif isinstance(dist, BernoulliDistribution):
            kind = BINARY
        elif isinstance(dist, (DiagGaussianDistribution, StateDependentNoiseDistribution)):
            kind = CONTINUOUS
            if isinstance(dist, StateDependentNoiseDistribution) and dist.bijector is not None:
                parts["squash"] = nn.Tanh()  # gSDE's mode is tanh(mean) when it squashes
        else:
            raise TypeError(f"unsupported action distribution {type(dist).__name__}")
    elif isinstance(policy, DQNPolicy):
        parts = dict(features=policy.q_net.features_extractor, head=policy.q_net.q_net)
        kind = ARGMAX
    elif isinstance(policy, SACPolicy):
        actor = policy.actor
        # SAC's deterministic action is tanh of the mean (SquashedDiagGaussianDistribution.mode)
        parts = dict(
            features=actor.features_extractor, latent=actor.latent_pi, head=actor.mu, squash=nn.Tanh()
        )
        kind = CONTINUOUS
    elif isinstance(policy, TD3Policy):  # TD3, DDPG: the actor ends in tanh already
        parts = dict(features=policy.actor.features_extractor, head=policy.actor.mu)
        kind = CONTINUOUS
    else:
        raise TypeError(
            f"rlq does not know the action path of {type(policy).__name__}; supported: the policies of "
            "A2C, PPO, DQN, TD3, DDPG and SAC"
        )
    return nn.Sequential(OrderedDict(parts)), kind


def acts_stochastically(policy: nn.Module) -> bool:
    """Return whether SB3's ``predict(deterministic=False)`` samples for this policy (DQN and TD3 never do)."""
    from stable_baselines3.dqn.policies import DQNPolicy
    from stable_baselines3.td3.policies import TD3Policy

    return not isinstance(policy, (DQNPolicy, TD3Policy))


@dataclass(frozen=True)
class PolicyInterface:
    """What SB3's ``predict`` needs of a policy besides its action network; build it with :meth:`of`."""

    kind: str
    """How the network's output becomes an action: :data:`ARGMAX`, :data:`MULTI_ARGMAX`, :data:`BINARY` or
    :data:`CONTINUOUS` (the second value :func:`action_network` returns)."""
    observation_space: spaces.Space
    """The policy's observation space."""
    action_space: spaces.Space
    """The policy's action space."""
    normalize_images: bool = True
    """Whether image observations are scaled to [0, 1], as the policy does."""
    squash_output: bool = False
    """Whether the network's tanh output in [-1, 1] is rescaled to the action bounds."""
    stochastic_in_sb3: bool = True
    """Whether SB3's ``predict(deterministic=False)`` samples for this policy (:func:`acts_stochastically`)."""

    @classmethod
    def of(cls, model_or_policy: Any, kind: str) -> PolicyInterface:
        """Return the interface of an SB3 model's (or policy's) action path whose output is of ``kind``."""
        policy = policy_of(model_or_policy)
        return cls(
            kind,
            policy.observation_space,
            policy.action_space,
            normalize_images=policy.normalize_images,
            squash_output=policy.squash_output,
            stochastic_in_sb3=acts_stochastically(policy),
        )


class ObservationPreprocessor:
    """SB3's observation handling for ``predict``: to a batched, preprocessed float tensor.

    Does what ``BasePolicy.obs_to_tensor`` and ``BasePolicy.extract_features`` do before the features
    extractor: transposes channel-last images, adds a batch dimension to a single observation, scales images
    to [0, 1] (``normalize_images``), one-hot encodes discrete observations.
    """

    def __init__(self, observation_space: spaces.Space, normalize_images: bool = True):
        self.observation_space = observation_space
        self.normalize_images = normalize_images

    def __call__(self, observation: Any) -> tuple[Any, bool]:
        """Return ``(preprocessed batch, whether observation was already a batch)``."""
        from stable_baselines3.common.preprocessing import is_image_space, preprocess_obs
        from stable_baselines3.common.utils import is_vectorized_observation, obs_as_tensor

        space = self.observation_space
        if isinstance(observation, tuple) and len(observation) == 2 and isinstance(observation[1], dict):
            raise ValueError(
                "predict() got a (observation, info) tuple: pass the observation alone (Gym's reset returns "
                "a tuple, a VecEnv's does not)"
            )
        if isinstance(observation, dict):
            if not isinstance(space, spaces.Dict):
                raise ValueError(f"got a dict observation but the observation space is {space}")
            vectorized, batch = False, {}
            for key, obs in observation.items():
                sub = space.spaces[key]
                obs = _channels_first(np.asarray(obs), sub) if is_image_space(sub) else np.asarray(obs)
                vectorized = vectorized or is_vectorized_observation(obs, sub)
                batch[key] = obs.reshape((-1, *sub.shape))
        else:
            if isinstance(observation, Tensor):
                observation = observation.detach().cpu().numpy()
            observation = np.asarray(observation)
            if is_image_space(space):
                observation = _channels_first(observation, space)
            vectorized = is_vectorized_observation(observation, space)
            batch = observation.reshape((-1, *space.shape))
        tensor = obs_as_tensor(batch, torch.device("cpu"))
        return preprocess_obs(tensor, space, normalize_images=self.normalize_images), vectorized


def _channels_first(observation: np.ndarray, space: spaces.Space) -> np.ndarray:
    from stable_baselines3.common.preprocessing import maybe_transpose

    return maybe_transpose(observation, space)


def _float_batch(x: Any) -> Tensor:
    if isinstance(x, dict):
        raise TypeError("dict observations cannot be used for calibration or ONNX export")
    return x.float()


def preprocess_observations(model_or_policy: Any, observations: Any) -> Tensor:
    """Return ``observations`` (raw, as an env gives them) as the preprocessed float batch the action path takes."""
    policy = policy_of(model_or_policy)
    batch, _ = ObservationPreprocessor(policy.observation_space, policy.normalize_images)(observations)
    return _float_batch(batch)
