"""Evaluate any Stable-Baselines3 model at any precision: a quantized copy of its action path with SB3's ``predict``.

QuaRL (Krishnan et al., arXiv 1910.01055, section 4.1) quantizes a trained policy after training and rolls it
out. Here :func:`quantized_policy` takes the *action path* of an SB3 policy, the modules one observation
passes through to the action (features extractor, actor MLP, action head; for DQN the Q-network), as one
``nn.Sequential`` (:func:`action_network`), quantizes a copy of it with :func:`rlq.quant.ptq` (torch) or
exports it with :func:`rlq.quant.export_onnx` (ONNX Runtime), and wraps it in a :class:`QuantizedPolicy`
whose ``predict`` has SB3's semantics: observation preprocessing (image transposition and scaling, one-hot
for discrete observations), argmax for discrete actions, clipping or unscaling of continuous actions, batch
dimension handling. The model itself is never changed.

Quantizing the action path as one module rather than patching sub-networks into the policy keeps one
graph: FX static quantization of a CNN policy then quantizes once at the observation and dequantizes once
at the output, and the ONNX export is the same graph.

The value networks, critics and target networks are not on the action path and are not quantized: acting
needs none of them. Quantized policies act deterministically (the mode of SB3's action distribution), as
QuaRL's evaluation does.
"""

from __future__ import annotations

import copy
import os
import tempfile
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
from gymnasium import spaces
from torch import Tensor

from rlq.quant import BACKENDS, OnnxPolicy, export_onnx, model_size_bytes, parse_precision, ptq
from rlq.quant.latency import build_backend, torch_threads
from rlq.quant.layers import has_convolutions

TORCH, ONNX = "torch", "onnx"
ONNX_PRECISIONS = ("fp32", "int8")

#: How the output of an action network becomes an action.
ARGMAX, MULTI_ARGMAX, BINARY, CONTINUOUS = "argmax", "multi_argmax", "binary", "continuous"


def _policy_of(model_or_policy: Any) -> nn.Module:
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

    policy = _policy_of(model_or_policy)
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


def _acts_stochastically(policy: nn.Module) -> bool:
    """Return whether SB3's ``predict(deterministic=False)`` samples for this policy (DQN and TD3 never do)."""
    from stable_baselines3.dqn.policies import DQNPolicy
    from stable_baselines3.td3.policies import TD3Policy

    return not isinstance(policy, (DQNPolicy, TD3Policy))


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


class QuantizedPolicy:
    """An SB3 policy's action path at a precision, with SB3's ``predict``; build it with :func:`quantized_policy`.

    ``network`` is the quantized ``nn.Module`` (torch backend) or an :class:`rlq.quant.OnnxPolicy` (ONNX
    backend); ``size_bytes`` its serialized size (for simulated ``intN``: the weights packed at N bits).
    """

    def __init__(
        self,
        network: Any,
        kind: str,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        *,
        normalize_images: bool = True,
        squash_output: bool = False,
        stochastic_in_sb3: bool = True,
        precision: str = "fp32",
        backend: str = TORCH,
        size_bytes: int | None = None,
    ):
        self.network = network
        self.kind = kind
        self.observation_space = observation_space
        self.action_space = action_space
        self.preprocess = ObservationPreprocessor(observation_space, normalize_images)
        self.squash_output = squash_output
        self.stochastic_in_sb3 = stochastic_in_sb3
        self.precision = precision
        self.backend = backend
        self.size_bytes = size_bytes

    def forward(self, batch: Tensor) -> Tensor:
        """Return the network's output (logits, Q-values or actions in the policy's scale) for a preprocessed batch."""
        with torch.no_grad():
            out = self.network(batch)
        return out[0] if isinstance(out, tuple) else out

    def _to_actions(self, out: Tensor) -> np.ndarray:
        if self.kind == ARGMAX:
            return out.argmax(dim=1).cpu().numpy()
        if self.kind == MULTI_ARGMAX:
            splits = torch.split(out, [int(n) for n in self.action_space.nvec], dim=1)
            return torch.stack([s.argmax(dim=1) for s in splits], dim=1).cpu().numpy()
        if self.kind == BINARY:
            return (out > 0).to(torch.int64).cpu().numpy()  # round(sigmoid(logit)), Bernoulli's mode
        return out.cpu().numpy()

    def predict(
        self,
        observation: Any,
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = True,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """Return ``(actions, state)`` for ``observation`` exactly as SB3's ``BasePolicy.predict`` would.

        Only deterministic actions: asking a policy that SB3 would sample from (A2C, PPO, SAC) for stochastic
        actions raises ValueError; DQN and TD3 policies ignore ``deterministic``, as in SB3.
        """
        if not deterministic and self.stochastic_in_sb3:
            raise ValueError(
                "quantized policies act deterministically (the mode of the action distribution); "
                "call predict(..., deterministic=True)"
            )
        batch, vectorized = self.preprocess(observation)
        actions = self._to_actions(self.forward(batch)).reshape((-1, *self.action_space.shape))
        if isinstance(self.action_space, spaces.Box):
            low, high = self.action_space.low, self.action_space.high
            if self.squash_output:  # the network's tanh output in [-1, 1] back to [low, high]
                actions = low + 0.5 * (actions + 1.0) * (high - low)
            else:
                actions = np.clip(actions, low, high)
        if not vectorized:
            actions = actions.squeeze(axis=0)
        return actions, state

    def __call__(self, observation: Any) -> np.ndarray:
        """Return the actions for ``observation`` (``predict`` without the state)."""
        return self.predict(observation)[0]

    def __repr__(self) -> str:
        return f"QuantizedPolicy(precision={self.precision!r}, backend={self.backend!r}, kind={self.kind!r})"


def preprocess_observations(model_or_policy: Any, observations: Any) -> Tensor:
    """Return ``observations`` (raw, as an env gives them) as the preprocessed float batch the action path takes."""
    policy = _policy_of(model_or_policy)
    batch, _ = ObservationPreprocessor(policy.observation_space, policy.normalize_images)(observations)
    return _float_batch(batch)


def _calibration_batches(batch: Tensor, size: int = 64) -> list[Tensor]:
    return list(torch.split(batch, size)) if len(batch) > size else [batch]


def quantized_policy(
    model_or_policy: Any,
    precision: str = "int8",
    calibration_obs: Any = None,
    backend: str = TORCH,
    *,
    activations: bool = False,
    per_channel_linear: bool = False,
    threads: int = 1,
    onnx_path: str | os.PathLike | None = None,
) -> QuantizedPolicy:
    """Return a :class:`QuantizedPolicy`: a quantized copy of the model's action path with SB3's ``predict``.

    ``model_or_policy``: an A2C, PPO, DQN, TD3, DDPG or SAC model, or its policy; it is not changed.

    ``precision`` (see :func:`rlq.quant.ptq`): ``"fp32"``, ``"fp16"``, ``"bf16"``; ``"int8"`` with real
    integer kernels: dynamic quantization (int8 weights, activations quantized per batch) for MLP policies,
    static quantization calibrated on ``calibration_obs`` for CNN policies (or any policy with
    ``activations=True``); ``"int2"`` ... ``"int16"`` simulated: weights quantized per tensor for linear
    layers (QuaRL's rule; per output channel with ``per_channel_linear``) and per output channel for
    convolutions, biases in float, with ``activations`` the inputs of every layer too.

    ``calibration_obs``: raw observations (an array of a batch of them, e.g. from
    :func:`collect_observations`), needed for static int8 and used for activation ranges.

    ``backend``: ``"torch"`` (eager PyTorch) or ``"onnx"`` (ONNX Runtime with ``threads`` threads; precision
    ``"fp32"`` or ``"int8"``; the model file is written to ``onnx_path`` when given, else to a temporary
    folder that is removed once the session has loaded it).
    """
    policy = _policy_of(model_or_policy)
    network, kind = action_network(policy)
    spec = parse_precision(precision)
    if backend not in (TORCH, ONNX):
        raise ValueError(f"unknown backend {backend!r}; choose 'torch' or 'onnx'")
    calibration = None
    if calibration_obs is not None:
        calibration = _calibration_batches(preprocess_observations(policy, calibration_obs))
    static = spec.bits == 8 and not spec.is_float and (activations or has_convolutions(network))
    if static and calibration is None:
        raise ValueError(
            "static int8 quantization (CNN policies, or activations=True) needs calibration observations: "
            "pass calibration_obs=collect_observations(env_id, model=model)"
        )
    common = dict(
        kind=kind,
        observation_space=policy.observation_space,
        action_space=policy.action_space,
        normalize_images=policy.normalize_images,
        squash_output=policy.squash_output,
        stochastic_in_sb3=_acts_stochastically(policy),
        precision=spec.name,
        backend=backend,
    )
    if backend == TORCH:
        quantized = ptq(
            network, spec, calibration, activations=activations, per_channel_linear=per_channel_linear
        )
        if spec.is_float or spec.bits == 8:
            size = model_size_bytes(quantized)
        else:
            size = model_size_bytes(quantized, spec.name)
        return QuantizedPolicy(quantized, size_bytes=size, **common)

    if spec.name not in ONNX_PRECISIONS:
        raise ValueError(f"the ONNX backend runs {', '.join(ONNX_PRECISIONS)}, not {spec.name}")
    fp32 = ptq(network, "fp32")  # an eval-mode copy: export never touches the model's own modules
    example = preprocess_observations(policy, policy.observation_space.sample())
    onnx_calibration = (
        calibration if spec.name == "int8" and (activations or has_convolutions(network)) else None
    )
    if onnx_path is not None:
        path = export_onnx(fp32, onnx_path, example, spec.name, calibration=onnx_calibration, overwrite=True)
        return QuantizedPolicy(OnnxPolicy(path, threads=threads), size_bytes=path.stat().st_size, **common)
    with tempfile.TemporaryDirectory(prefix="rlq-policy-") as tmp:
        path = export_onnx(
            fp32, Path(tmp) / f"policy-{spec.name}.onnx", example, spec.name, calibration=onnx_calibration
        )
        session = OnnxPolicy(path, threads=threads)  # ONNX Runtime holds the model in memory from here on
        size = path.stat().st_size
    return QuantizedPolicy(session, size_bytes=size, **common)


def collect_observations(
    env_id: str,
    n_observations: int = 512,
    model: Any = None,
    seed: int = 0,
    deterministic: bool = True,
    **env_kwargs: Any,
) -> np.ndarray:
    """Return ``n_observations`` raw observations (stacked, as the env gives them) from a rollout of ``env_id``.

    The rollout acts with ``model.predict`` when a model (or anything with ``predict``) is given, else
    uniformly at random; the observations are those a quantized policy will meet, for calibrating activation
    ranges. Environments come from :func:`rlq.rl.envs.make_vec_env` (Atari: preprocessed, 4 stacked frames).
    """
    from rlq.rl.envs import make_vec_env

    if n_observations < 1:
        raise ValueError(f"n_observations must be >= 1, got {n_observations}")
    env = make_vec_env(env_id, n_envs=1, seed=seed, **env_kwargs)
    env.action_space.seed(seed)
    observations = []
    try:
        obs = env.reset()
        while len(observations) < n_observations:
            observations.append(np.asarray(obs)[0].copy())
            if model is not None:
                action, _ = model.predict(obs, deterministic=deterministic)
            else:
                action = np.asarray([env.action_space.sample()])
            obs, _, _, _ = env.step(action)
    finally:
        env.close()
    return np.stack(observations)


def make_policy(
    algo: str,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    policy: str = "MlpPolicy",
    seed: int = 0,
    **policy_kwargs: Any,
) -> nn.Module:
    """Return a freshly initialised SB3 policy of ``algo`` for the given spaces, without an environment.

    For measuring networks of a given shape (latency, size): e.g. ``make_policy("TD3", Box(17), Box(6),
    net_arch=[256, 256])`` is TD3's HalfCheetah policy; ``policy="CnnPolicy"`` with an image space gives the
    Nature CNN. Channel-last image spaces are made channel-first, as SB3 does for image environments.
    """
    from stable_baselines3.common.preprocessing import is_image_space, is_image_space_channels_first
    from stable_baselines3.common.vec_env import VecTransposeImage

    from rlq.rl.agents import algorithm_class

    cls = algorithm_class(algo)
    if is_image_space(observation_space) and not is_image_space_channels_first(observation_space):
        observation_space = VecTransposeImage.transpose_space(observation_space)  # as SB3 wraps image envs
    policy_class = cls.policy_aliases.get(policy)
    if policy_class is None:
        raise ValueError(f"{algo} has no policy {policy!r}; choose one of {', '.join(cls.policy_aliases)}")
    torch.manual_seed(seed)
    return policy_class(observation_space, action_space, lambda _: 1e-3, **policy_kwargs)


def benchmark_action_network(
    model_or_policy: Any,
    backends: Sequence[str] = BACKENDS,
    batch_sizes: Sequence[int] = (1,),
    *,
    repeats: int = 100,
    rounds: int = 5,
    warmup: int = 10,
    threads: int = 1,
    calibration_obs: Any = None,
    seed: int = 0,
) -> pd.DataFrame:
    """Return the latency and size of a policy's action path on each backend, measured side by side.

    Backends are those of :data:`rlq.quant.BACKENDS` (``torch-fp32``, ``torch-int8``, ``onnx-fp32``,
    ``onnx-int8``), each with ``threads`` threads. Latency is of the network alone on a preprocessed batch
    of random observations (no SB3 bookkeeping). On a shared machine timings drift, so every backend is
    built first, then measured in ``rounds`` interleaved rounds of ``repeats`` calls each; the median is over
    all calls. int8 is dynamic for MLPs and static for CNNs (calibrated on ``calibration_obs``, or on random
    observations from the observation space).

    Columns: ``backend``, ``batch_size``, ``median_us``, ``p90_us``, ``size_bytes``.
    """
    policy = _policy_of(model_or_policy)
    network, _ = action_network(policy)
    network = ptq(network, "fp32")
    space = policy.observation_space
    space.seed(seed)
    if calibration_obs is None:
        calibration_obs = np.stack([space.sample() for _ in range(64)])
    calibration = _calibration_batches(preprocess_observations(policy, calibration_obs))
    examples = {
        b: preprocess_observations(policy, np.stack([space.sample() for _ in range(b)])) for b in batch_sizes
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlq-bench-") as workdir, torch_threads(threads):
        built, sizes = {}, {}
        for backend in backends:
            built[backend] = build_backend(
                network,
                examples[min(batch_sizes)],
                backend,
                workdir,
                calibration=calibration,
                threads=threads,
            )
            onnx_file = Path(workdir) / f"{backend}.onnx"
            sizes[backend] = (
                onnx_file.stat().st_size if onnx_file.exists() else model_size_bytes(built[backend])
            )
        for batch_size, example in examples.items():
            inputs = {b: example if b.startswith("torch") else example.numpy() for b in backends}
            times: dict[str, list[float]] = {b: [] for b in backends}
            for _ in range(rounds):
                for backend in backends:
                    fn = built[backend]
                    with torch.inference_mode():
                        for _ in range(warmup):
                            fn(inputs[backend])
                        for _ in range(repeats):
                            start = time.perf_counter_ns()
                            fn(inputs[backend])
                            times[backend].append((time.perf_counter_ns() - start) / 1e3)
            for backend in backends:
                t = np.asarray(times[backend])
                rows.append(
                    dict(
                        backend=backend,
                        batch_size=batch_size,
                        median_us=float(np.median(t)),
                        p90_us=float(np.percentile(t, 90)),
                        size_bytes=int(sizes[backend]),
                    )
                )
    return pd.DataFrame(rows, columns=["backend", "batch_size", "median_us", "p90_us", "size_bytes"])


def policy_sizes(
    model_or_policy: Any, precisions: Sequence[str] = ("fp32", "fp16", "int8", "int4", "int2")
) -> pd.DataFrame:
    """Return the serialized size of a policy's action path stored at each precision (``precision``, ``size_bytes``).

    Float precisions cast the tensors; ``intN`` stores weights as packed N-bit codes with per-channel scales
    (:func:`rlq.quant.model_size_bytes`).
    """
    network, _ = action_network(model_or_policy)
    network = copy.deepcopy(network)
    return pd.DataFrame(
        [dict(precision=p, size_bytes=model_size_bytes(network, p)) for p in precisions],
        columns=["precision", "size_bytes"],
    )


def evaluate_precisions(
    model: Any,
    env_id: str,
    precisions: Sequence[str] = ("fp32", "fp16", "int8"),
    n_episodes: int = 10,
    seed: int = 0,
    *,
    backend: str = TORCH,
    calibration_obs: Any = None,
    **quantize_kwargs: Any,
) -> pd.DataFrame:
    """Return the deterministic return of ``model`` quantized to each precision, on the same seeded episodes.

    Every precision is evaluated with :func:`rlq.rl.evaluate.evaluate` on ``n_episodes`` episodes from ``seed``,
    so differences come from quantization alone. ``relative_change`` is against the ``fp32`` row of the same
    backend when one is evaluated (``(r - r_fp32) / |r_fp32|``). Other keyword arguments go to
    :func:`quantized_policy`.

    Columns: ``precision``, ``bits``, ``backend``, ``mean_return``, ``std_return``, ``relative_change``,
    ``size_bytes``, ``eval_seconds``.
    """
    from rlq.quant import relative_change
    from rlq.rl.evaluate import evaluate

    rows = []
    for precision in precisions:
        spec = parse_precision(precision)
        start = time.perf_counter()
        policy = quantized_policy(model, spec, calibration_obs, backend, **quantize_kwargs)
        result = evaluate(policy, env_id, n_episodes=n_episodes, seed=seed)
        rows.append(
            dict(
                precision=spec.name,
                bits=spec.bits,
                backend=backend,
                mean_return=result.mean,
                std_return=result.std,
                size_bytes=policy.size_bytes,
                eval_seconds=time.perf_counter() - start,
            )
        )
    table = pd.DataFrame(rows)
    reference = table.loc[table["precision"] == "fp32", "mean_return"]
    if len(reference) and reference.iloc[0] != 0:
        table["relative_change"] = [relative_change(r, reference.iloc[0]) for r in table["mean_return"]]
    else:
        table["relative_change"] = np.nan
    columns = ["precision", "bits", "backend", "mean_return", "std_return", "relative_change", "size_bytes"]
    return table[[*columns, "eval_seconds"]]


def lowest_bits_within(table: pd.DataFrame, tolerance: float = 0.05) -> int | None:
    """Return the lowest integer bit width from which every wider one keeps its return within ``tolerance`` of fp32.

    ``table`` is :func:`evaluate_precisions`'s output holding ``fp32`` and ``intN`` rows. A width counts when
    ``relative_change >= -tolerance`` (higher returns are fine); the answer is the start of the unbroken run
    of such widths that reaches the widest one evaluated (QuaRL's "sweet spot"), or None if the widest
    already fails.
    """
    ints = table[table["precision"].str.startswith("int")].sort_values("bits", ascending=False)
    lowest = None
    for bits, change in zip(ints["bits"], ints["relative_change"], strict=True):
        if not change >= -tolerance:
            break
        lowest = int(bits)
    return lowest
