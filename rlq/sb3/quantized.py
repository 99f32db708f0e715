"""Evaluate any Stable-Baselines3 model at any precision: a quantized copy of its action path with SB3's ``predict``.

QuaRL (Krishnan et al., arXiv 1910.01055, section 4.1) quantizes a trained policy after training and rolls it
out. Here :func:`quantized_policy` takes the *action path* of an SB3 policy, the modules one observation
passes through to the action (features extractor, actor MLP, action head; for DQN the Q-network), as one
``nn.Sequential`` (:func:`rlq.sb3.action_path.action_network`), quantizes a copy of it with :func:`rlq.quant.ptq` (torch) or
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
from gymnasium import spaces
from torch import Tensor

from rlq.quant import (
    OnnxPolicy,
    export_onnx,
    model_size_bytes,
    parse_precision,
    perturb_weights,
    ptq,
)
from rlq.quant.quantizable import has_convolutions
from rlq.quant.tensor import KERNEL_INT8
from rlq.sb3.action_path import (
    ARGMAX,
    BINARY,
    MULTI_ARGMAX,
    ObservationPreprocessor,
    PolicyInterface,
    action_network,
    policy_of,
    preprocess_observations,
)

TORCH, ONNX = "torch", "onnx"
ONNX_PRECISIONS = ("fp32", "int8")


class QuantizedPolicy:
    """An SB3 policy's action path at a precision, with SB3's ``predict``; build it with :func:`quantized_policy`.

    ``network`` is the quantized ``nn.Module`` (torch backend) or an :class:`rlq.quant.OnnxPolicy` (ONNX
    backend); ``size_bytes`` its serialized size (for simulated ``intN``: the weights packed at N bits).
    """

    def __init__(
        self,
        network: Any,
        interface: PolicyInterface,
        *,
        precision: str = "fp32",
        backend: str = TORCH,
        size_bytes: int | None = None,
    ):
        self.network = network
        self.interface = interface
        self.kind = interface.kind
        self.observation_space = interface.observation_space
        self.action_space = interface.action_space
        self.preprocess = ObservationPreprocessor(interface.observation_space, interface.normalize_images)
        self.squash_output = interface.squash_output
        self.stochastic_in_sb3 = interface.stochastic_in_sb3
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
    folder that is removed once ONNX Runtime has loaded it).
    """
    policy = policy_of(model_or_policy)
    network, kind = action_network(policy)
    spec = parse_precision(precision)
    if backend not in (TORCH, ONNX):
        raise ValueError(f"unknown backend {backend!r}; choose 'torch' or 'onnx'")
    calibration = None
    if calibration_obs is not None:
        calibration = _calibration_batches(preprocess_observations(policy, calibration_obs))
    static = spec.name == KERNEL_INT8 and (activations or has_convolutions(network))
    if static and calibration is None:
        raise ValueError(
            "static int8 quantization (CNN policies, or activations=True) needs calibration observations: "
            "pass calibration_obs=collect_observations(env_id, model=model)"
        )
    common = dict(precision=spec.name, backend=backend)
    interface = PolicyInterface.of(policy, kind)
    if backend == TORCH:
        quantized = ptq(
            network, spec, calibration, activations=activations, per_channel_linear=per_channel_linear
        )
        if spec.is_float or not spec.simulated:  # kernel int8 counts its packed int8 weights as they are
            size = model_size_bytes(quantized)
        else:
            size = model_size_bytes(quantized, spec.name)
        return QuantizedPolicy(quantized, interface, size_bytes=size, **common)

    if spec.name not in ONNX_PRECISIONS:
        raise ValueError(f"the ONNX backend runs {', '.join(ONNX_PRECISIONS)}, not {spec.name}")
    fp32 = ptq(network, "fp32")  # an eval-mode copy: export never touches the model's own modules
    example = preprocess_observations(policy, policy.observation_space.sample())
    onnx_calibration = (
        calibration if spec.name == "int8" and (activations or has_convolutions(network)) else None
    )
    if onnx_path is not None:
        path = export_onnx(fp32, onnx_path, example, spec.name, calibration=onnx_calibration, overwrite=True)
        return QuantizedPolicy(
            OnnxPolicy(path, threads=threads), interface, size_bytes=path.stat().st_size, **common
        )
    with tempfile.TemporaryDirectory(prefix="rlq-policy-") as tmp:
        path = export_onnx(
            fp32, Path(tmp) / f"policy-{spec.name}.onnx", example, spec.name, calibration=onnx_calibration
        )
        session = OnnxPolicy(path, threads=threads)  # ONNX Runtime holds the model in memory from here on
        size = path.stat().st_size
    return QuantizedPolicy(session, interface, size_bytes=size, **common)


def weights_only(bits: int) -> str:
    """Return the weights-only simulated precision at ``bits``: ``"sim8"`` at 8 (``"int8"`` is the kernels)."""
    return "sim8" if bits == 8 else f"int{bits}"


def deployed_qat_policy(model: Any, callback: Any, calibration_obs: Any = None) -> QuantizedPolicy:
    """Return ``model``, trained with the QAT ``callback``, as it is deployed: its weights at the callback's bits.

    The rule is the weights-only simulated one (:func:`weights_only`) with the callback's ``per_channel``, and
    the activation quantizers the model trained with act as they are. A model loaded from a checkpoint has
    none: with the callback's ``activations`` it gets fresh ones calibrated on ``calibration_obs``, as PTQ does.
    """
    from rlq.quant.activations import input_quantizers

    fresh_activations = callback.activations and not input_quantizers(model.policy)
    return quantized_policy(
        model,
        weights_only(callback.bits),
        calibration_obs=calibration_obs,
        per_channel_linear=callback.per_channel,
        activations=fresh_activations,
    )


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


def network_spaces(algorithm: str, obs_shape: Sequence[int], n_actions: int) -> tuple[Any, Any, str]:
    """Return the observation space, action space and SB3 policy kind of a network: a 3-d shape means uint8 frames and a CNN."""
    if len(obs_shape) == 3:
        obs_space, kind = spaces.Box(0, 255, tuple(obs_shape), np.uint8), "CnnPolicy"
    else:
        obs_space, kind = spaces.Box(-np.inf, np.inf, tuple(obs_shape), np.float32), "MlpPolicy"
    if algorithm in ("TD3", "DDPG", "SAC"):
        action_space = spaces.Box(-1.0, 1.0, (n_actions,), np.float32)
    else:
        action_space = spaces.Discrete(n_actions)
    return obs_space, action_space, kind


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

    ``table`` is :func:`evaluate_precisions`'s output holding ``fp32`` and ``intN`` rows; only the weights-only
    simulated widths are ranked (``sim8`` stands for 8 bits; the ``int8`` kernels, which quantize activations
    too, are not comparable with them). A width counts when
    ``relative_change >= -tolerance`` (higher returns are fine); the answer is the start of the unbroken run
    of such widths that reaches the widest one evaluated (QuaRL's "sweet spot"), or None if the widest
    already fails.
    """
    # like with like: the weights-only simulated widths (sim8 among them), not the int8 kernels
    weights_only = table["precision"].map(lambda p: parse_precision(p).simulated if p != "fp32" else False)
    ints = table[weights_only].sort_values("bits", ascending=False)
    lowest = None
    for bits, change in zip(ints["bits"], ints["relative_change"], strict=True):
        if not change >= -tolerance:
            break
        lowest = int(bits)
    return lowest


FLOAT, KERNEL, WEIGHTS_ONLY, NOISE = "float", "kernel", "weights-only", "noise"
"""The ``scheme`` of a :class:`Quantizer` (and :data:`ONNX`): float casts, torch int8 kernels (weights and
activations), simulated weights-only integers, ONNX Runtime, and fp32 weights plus matched uniform noise."""
SCHEMES = (FLOAT, KERNEL, WEIGHTS_ONLY, ONNX, NOISE)

NOISE_SEED_OFFSET = 30_000
"""Noise draw ``d`` at ``bits`` of the agent trained with ``seed`` is seeded
``seed + NOISE_SEED_OFFSET + 100 * bits + d``: apart from training, evaluation and calibration seeds."""


@dataclass(frozen=True)
class Quantizer:
    """One precision a PTQ sweep evaluates every agent at: :func:`rlq.quant.ptq` of its action path.

    Calling it with a trained SB3 model returns the quantized policy that acts (through
    :func:`quantized_policy`, which applies ``ptq`` to the features extractor, MLP and action
    head and gives it SB3's ``predict``). ``scheme``: ``"float"`` (fp32, fp16), ``"kernel"`` (int8 with real
    integer kernels: dynamic for MLP policies, static calibrated for CNNs), ``"weights-only"`` (simulated
    integer weights; :func:`weights_only` names the width), ``"onnx"`` (ONNX Runtime, fp32 or int8) or
    ``"noise"``: the fp32 weights plus uniform noise of half a quantization step at the precision's width
    (:func:`rlq.quant.perturb_weights`), draw ``draw``. ``per_channel_linear``: one scale per output channel
    in linear layers too (QuaRL used one per tensor).
    """

    precision: str
    scheme: str = FLOAT
    per_channel_linear: bool = False
    draw: int = 0

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {self.scheme!r}")
        parse_precision(self.precision)  # names the precision when it is unknown

    @property
    def bits(self) -> int:
        """Return the precision's width in bits."""
        return parse_precision(self.precision).bits

    @property
    def backend(self) -> str:
        """Return where the policy runs: ``"onnx"`` (ONNX Runtime) or ``"torch"``."""
        return "onnx" if self.scheme == ONNX else "torch"

    def __call__(self, model: Any, calibration: Any = None, seed: int = 0) -> Any:
        """Return ``model``'s quantized policy (a noise draw is seeded from the agent's ``seed``)."""
        if self.scheme == ONNX:
            return quantized_policy(model, self.precision, calibration, "onnx")
        if self.scheme != NOISE:
            return quantized_policy(
                model, self.precision, calibration, per_channel_linear=self.per_channel_linear
            )
        policy = quantized_policy(model, "fp32")  # an eval-mode copy of the action path, perturbed below
        noise_seed = int(seed + NOISE_SEED_OFFSET + 100 * self.bits + self.draw)
        policy.network = perturb_weights(
            policy.network, self.bits, seed=noise_seed, per_channel_linear=self.per_channel_linear
        )
        policy.precision = self.precision
        return policy
