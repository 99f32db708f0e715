"""GST and gradual magnitude pruning as Stable-Baselines3 callbacks (TD3, SAC, DDPG, A2C, PPO, DQN).

Paper: Lee et al., "GST: Group-Sparse Training for Accelerating Deep Reinforcement Learning",
arXiv 2101.09650 (https://arxiv.org/abs/2101.09650). Baseline: Zhu & Gupta, "To prune, or not to prune",
arXiv 1710.01878 (gradual magnitude pruning, eq. 1).

    from rlq.sb3.gst import GSTCallback, GradualPruningCallback
    gst = GSTCallback(block_schedule=((0.0, 4), (0.25, 2)), s_shift=0.25, bc_end=0.5, prune_every=1000)
    model.learn(100_000, callback=gst)
    gst.history                      # one row per action and every ``log_every`` steps
    gst.average_compression_ratio()  # GST's headline measure

The timeline (block-circulant from step 0, block-size transitions, S_shift, the hand-over to pruning) and
the reward-aware target are :class:`rlq.compress.GSTSchedule` and :class:`rlq.compress.RewardAwareSparsity`;
the reward-aware rule, S_shift's meaning and the exact transition are OUR DESIGN (the paper does not
publish them). This module puts them into SB3's training:

- **Layers.** Networks are found per SB3 network with :func:`rlq.sb3.networks.layer_chains`. A layer is
  eligible when it belongs to an online chain and (with ``skip_first_last``) is neither the first nor the
  last layer of any chain: SAC's trunk feeding two heads and a CNN shared by actor and critic are handled.
  ``covered_fraction`` is the share of the online networks' weights held by eligible layers (paper: 94-99%).
- **Targets.** Target networks (TD3/DDPG ``actor_target`` and ``critic_target``, SAC ``critic_target``,
  DQN ``q_net_target``) get the same structure as their online networks at every change: the same block
  size, the same hidden-unit reordering (exact transitions), and the online network's masks (masks are
  chosen from the online weights only). Targets keep their own values (projected, permuted or masked the
  same way), so polyak averaging continues without a hard update; since parameters keep their order and
  shapes match, ``polyak_update`` stays aligned and pruned target weights stay exactly zero.
- **Optimizers.** Every transform keeps Parameter objects, so the optimizers still hold the live
  parameters. After a structural change (block-circulant on, a transition, the hand-over) all optimizer
  state of the policy is reset, since moments of the old shapes or unit order no longer fit; a pruning
  update keeps it (masked entries get zero gradients). The state of masked entries is parked (first
  moments 0, second moments 1) at every mask change, after every reset and every ``park_every`` steps:
  the weights trained are the same, but ``torch.sqrt`` of the zeros Adam would otherwise hold there is
  5x slower on CPU (see :mod:`rlq.compress.optimizer_state`).
- **Reward.** Finished episodes are read from ``self.locals["infos"]`` (Monitor's ``"episode"`` entries);
  the reward given to the controller is the mean return of the last ``reward_window`` episodes (None
  until one has finished, and the target then holds).
- **Compression ratio.** ``1 - stored / dense`` weights (biases excluded) over every Linear/Conv layer of
  the *online* networks. Target networks mirror them, so the ratio over the whole policy, targets
  included, is the same number. :meth:`CompressionCallback.average_compression_ratio` averages it over
  the training updates: from ``learning_starts`` (off-policy; 0 on-policy) to the end.
- **Checkpoints.** Each callback has a ``checkpoint_key`` and ``state_dict``/``load_state_dict`` (schedule,
  controller, reward window, history), used by :func:`rlq.sb3.checkpoint.save_compressed` and by
  :func:`rlq.agents.train_agent`, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from torch import nn
from torch.nn.utils import parametrize

from rlq.compress import (
    GradualPruning,
    GradualPruningConfig,
    GSTAction,
    GSTConfig,
    GSTSchedule,
    RewardAwareConfig,
    average_compression_ratio,
    block_size_of,
    is_block_circulant,
    layer_report,
    magnitude_prune_,
    make_block_circulant_,
    park_masked_state_,
    remove_block_circulant_,
    reset_optimizer_state_,
    split_blocks_exact_,
    transition_projection_,
)
from rlq.compress.block_circulant import stored_target
from rlq.compress.gst import check_positive_int
from rlq.compress.layers import dense_weight_numel
from rlq.compress.masks import bake_mask_, mask_of, prune_with_mask_, stored_tensor
from rlq.compress.measures import stored_weight_count
from rlq.parallel import run_jobs
from rlq.sb3.networks import chain_ends, layer_chains, optimizers, refresh_optimizers, target_pairs

HISTORY_COLUMNS = [
    "step",
    "event",
    "phase",
    "block_size",
    "target_sparsity",
    "sparsity",
    "compression_ratio",
    "mean_reward",
    "episodes",
    "decision",
]
"""Columns of :attr:`CompressionCallback.history`."""

EVENT_COLUMNS = [
    "step",
    "kind",
    "block_size",
    "sparsity",
    "method",
    "layers",
    "covered_fraction",
    "mean_shift",
]
"""Columns of :attr:`CompressionCallback.events` (one row per structural change or pruning update)."""

METHODS = ("dense", "pruning", "gst")


# --------------------------------------------------------------------------------------------------------
# Which layers of an SB3 policy are compressed, and their target twins


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
# Callbacks


def _json_safe(value: Any) -> Any:
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


class CompressionCallback(BaseCallback):
    """Record an SB3 model's compression ratio and training reward over training (compresses nothing).

    On its own it is the dense baseline's recorder; :class:`GSTCallback` and :class:`GradualPruningCallback`
    add compression. Knobs:

    - ``skip_first_last``: keep the first and last layer of every chain dense (the paper's selective
      application; see the module docstring).
    - ``reward_window``: episodes averaged into ``mean_reward`` (the reward-aware controller's input).
    - ``log_every``: environment steps between two history rows (rows are also written at every action,
      so averages over the history are exact).
    - ``cache_rollouts``: for on-policy algorithms (A2C, PPO), expand block-circulant weights once per
      rollout instead of at every step (``torch.nn.utils.parametrize.cached()`` between SB3's
      ``on_rollout_start`` and ``on_rollout_end``; no parameter changes during a rollout). The cache is
      process-wide: should ``learn()`` raise in the middle of a rollout it stays on until this callback's
      next ``learn()`` or :meth:`close_rollout_cache`.
    - ``verbose``: SB3's verbosity (1 logs each action through SB3's logger).
    """

    checkpoint_key = "compression"
    """Key under which checkpoints store this callback's state."""

    park_every = 1000
    """Environment steps between two refreshes of the masked entries' optimizer state (see
    :mod:`rlq.compress.optimizer_state`): a reset after a structural change starts them at 0 again, and
    a parked second moment decays by Adam's beta2 or RMSprop's alpha at every step."""

    def __init__(
        self,
        skip_first_last: bool = True,
        reward_window: int = 10,
        log_every: int = 1000,
        cache_rollouts: bool = True,
        verbose: int = 0,
    ):
        super().__init__(verbose)
        if not isinstance(skip_first_last, bool):
            raise ValueError(f"skip_first_last must be a bool, got {skip_first_last!r}")
        self.skip_first_last = skip_first_last
        self.reward_window = check_positive_int("reward_window", reward_window)
        self.log_every = check_positive_int("log_every", log_every)
        self.returns: deque[float] = deque(maxlen=self.reward_window)
        self.episodes = 0
        self.layers: PolicyLayers | None = None
        self.start_step = 0
        self.total_steps: int | None = None
        self._rows: list[dict[str, Any]] = []
        self._events: list[dict[str, Any]] = []
        self._last_log: int | None = None
        self._last_park: int | None = None
        self._park_pending = False
        self.cache_rollouts = bool(cache_rollouts)
        self._rollout_cache: Any = None

    # ---- SB3 hooks

    def _init_callback(self) -> None:
        self.close_rollout_cache()
        self.layers = policy_layers(self.model.policy, self.skip_first_last)
        self.start_step = int(getattr(self.model, "learning_starts", 0) or 0)
        if self.total_steps is None:
            self.total_steps = int(self.model._total_timesteps)
        self._setup()

    def _on_training_start(self) -> None:
        self._act()
        if not self._rows or self._rows[-1]["step"] != self.num_timesteps:
            self._log("start")

    def _on_step(self) -> bool:
        for info in self.locals.get("infos", ()):
            episode = info.get("episode") if isinstance(info, dict) else None
            if episode is not None:
                self.returns.append(float(episode["r"]))
                self.episodes += 1
        acted = self._act()
        if (
            self._park_pending
            or self._last_park is None
            or self.num_timesteps - self._last_park >= self.park_every
        ):
            self._park_masked_state_()
        if acted:
            return True
        if self._last_log is None or self.num_timesteps - self._last_log >= self.log_every:
            self._log("log")
        return True

    def _on_rollout_start(self) -> None:
        self.close_rollout_cache()
        if self.cache_rollouts and isinstance(self.model, OnPolicyAlgorithm):
            self._rollout_cache = parametrize.cached()
            self._rollout_cache.__enter__()

    def _on_rollout_end(self) -> None:
        self.close_rollout_cache()

    def close_rollout_cache(self) -> None:
        """Leave the rollout's parametrization cache, if this callback opened one."""
        cache, self._rollout_cache = self._rollout_cache, None
        if cache is not None:
            cache.__exit__(None, None, None)

    @contextmanager
    def _changing_structure(self) -> Iterator[None]:
        """Change the compression inside: a rollout's parametrization cache is dropped, then reopened."""
        was_open = self._rollout_cache is not None
        self.close_rollout_cache()
        try:
            yield
        finally:
            if was_open:
                self._rollout_cache = parametrize.cached()
                self._rollout_cache.__enter__()

    def _on_training_end(self) -> None:
        self.close_rollout_cache()
        if not self._rows or self._rows[-1]["step"] != self.num_timesteps:
            self._log("end")

    # ---- what subclasses change

    def _setup(self) -> None:
        """Check the policy once its layers are known (subclasses raise on what they cannot handle)."""

    def _act(self) -> bool:
        """Carry out the compression actions due at ``self.num_timesteps``; return whether any ran."""
        return False

    def _status(self) -> dict[str, Any]:
        """Return the phase, block size, target and applied sparsity and decision for a history row."""
        return {
            "phase": "dense",
            "block_size": None,
            "target_sparsity": 0.0,
            "sparsity": 0.0,
            "decision": None,
        }

    # ---- measures

    @property
    def mean_reward(self) -> float | None:
        """Return the mean return of the last ``reward_window`` finished episodes (None before the first)."""
        return sum(self.returns) / len(self.returns) if self.returns else None

    @property
    def covered_fraction(self) -> float:
        """Return the share of the online networks' weights in the layers this callback compresses."""
        return self._require_layers().covered_fraction

    def layer_report(self) -> pd.DataFrame:
        """Return one row per online Linear/Conv layer: kind, block size, stored and dense weights, ratio."""
        layers = self._require_layers()
        rows = [r for r in layer_report(self.model.policy) if r["name"] in set(layers.weight_names)]
        frame = pd.DataFrame(rows)
        frame["eligible"] = frame["name"].isin(layers.eligible)
        frame["has_target"] = frame["name"].isin(layers.targets)
        return frame

    def compression_ratio(self) -> float:
        """Return ``1 - stored / dense`` weights over the online networks (targets mirror them)."""
        weights = self._require_layers().online_weights.values()
        stored = sum(stored_weight_count(layer) for layer in weights)
        return 1.0 - stored / sum(dense_weight_numel(layer) for layer in weights)

    def average_compression_ratio(self, start_step: int | None = None, end_step: int | None = None) -> float:
        """Return the compression ratio averaged over training steps ``[start_step, end_step)``.

        Defaults: from ``learning_starts`` (the first training update of an off-policy algorithm; 0 for
        on-policy ones) to the last step seen (at least the run's total steps). Each history row's ratio
        holds until the next row.
        """
        history = self.history.drop_duplicates("step", keep="last")
        if history.empty:
            raise ValueError("no history yet: train with this callback first")
        start = self.start_step if start_step is None else int(start_step)
        last = int(history["step"].iloc[-1])
        end = max(last + 1, self.total_steps or 0) if end_step is None else int(end_step)
        if end <= start:
            raise ValueError(f"end_step {end} must exceed start_step {start}")
        before = history[history["step"] <= start]
        after = history[(history["step"] > start) & (history["step"] < end)]
        first_value = (
            before["compression_ratio"].iloc[-1] if len(before) else history["compression_ratio"].iloc[0]
        )
        values = [float(first_value), *after["compression_ratio"].astype(float)]
        steps = [start, *after["step"].astype(int)]
        return average_compression_ratio(values, steps, end)

    @property
    def history(self) -> pd.DataFrame:
        """Return the history rows as a DataFrame with :data:`HISTORY_COLUMNS`."""
        return pd.DataFrame(self._rows, columns=HISTORY_COLUMNS)

    @property
    def events(self) -> pd.DataFrame:
        """Return one row per action carried out (:data:`EVENT_COLUMNS`)."""
        return pd.DataFrame(self._events, columns=EVENT_COLUMNS)

    # ---- helpers shared by the subclasses

    def _require_layers(self) -> PolicyLayers:
        if self.layers is None:
            raise RuntimeError("the callback has not seen a model yet: pass it to model.learn(...) first")
        return self.layers

    def _log(self, event: str) -> None:
        self._last_log = self.num_timesteps
        reward = self.mean_reward
        row = {
            "step": int(self.num_timesteps),
            "event": event,
            **self._status(),
            "compression_ratio": self.compression_ratio(),
            "mean_reward": float("nan") if reward is None else reward,
            "episodes": self.episodes,
        }
        self._rows.append({k: row.get(k) for k in HISTORY_COLUMNS})
        if self.verbose >= 1 and event not in ("log",):
            self.logger.log(
                f"[{type(self).__name__}] step {row['step']}: {event}, ratio {row['compression_ratio']:.3f}"
            )

    def _record_event(
        self, kind: str, report_names: Sequence[str], shifts: Sequence[float] = (), **extra
    ) -> None:
        layers = self._require_layers()
        names = [n for n in report_names if n in layers.online]
        row = {
            "step": int(self.num_timesteps),
            "kind": kind,
            "layers": len(names),
            "covered_fraction": layers.covered_fraction_of(names),
            "mean_shift": float(np.mean(shifts)) if len(shifts) else float("nan"),
            **extra,
        }
        self._events.append({k: row.get(k) for k in EVENT_COLUMNS})

    def _prune_(self, sparsity: float, scope: str) -> list[str]:
        """Prune the eligible online layers to ``sparsity`` by magnitude and give targets the same masks."""
        layers = self._require_layers()
        previous = {
            name: mask.clone() for name in layers.eligible if (mask := self._mask_of(name)) is not None
        }
        report = magnitude_prune_(self.model.policy, sparsity, scope=scope, layers=layers.eligible)
        self._mirror_targets_()
        self._park_masked_state_(previous)
        return report.compressed

    def _mask_of(self, name: str) -> torch.Tensor | None:
        """Return the mask on online layer ``name``'s stored values (weights or B-vectors), if pruned."""
        return mask_of(*stored_target(self._require_layers().online[name]))

    def _park_masked_state_(self, previous: dict[str, torch.Tensor] | None = None) -> None:
        """Park the optimizer state of masked entries (and zero it where a mask regrew entries).

        Training computes the same weights either way; see :mod:`rlq.compress.optimizer_state` for why.
        Until every masked parameter has optimizer state (optimizers create it at their first step after
        a reset), parking is repeated at every environment step.
        """
        layers = self._require_layers()
        policy_optimizers = optimizers(self.model.policy)
        masked = parked = 0
        for name in layers.eligible:
            mask = self._mask_of(name)
            if mask is None:
                continue
            masked += 1
            param = stored_tensor(*stored_target(layers.online[name]))
            for optimizer in policy_optimizers:
                if park_masked_state_(optimizer, param, mask, (previous or {}).get(name)):
                    parked += 1
                    break
        self._last_park = self.num_timesteps
        self._park_pending = parked < masked

    def _mirror_targets_(self) -> None:
        """Give every target layer its online layer's mask (structure is mirrored by the transforms)."""
        layers = self._require_layers()
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

    def _reset_optimizers_(self) -> None:
        """Drop all optimizer state of the policy after a structural change (shapes or unit order changed)."""
        policy = self.model.policy
        for optimizer in optimizers(policy):
            reset_optimizer_state_(optimizer)
        refresh_optimizers(policy)
        self._park_pending = True  # masked entries' fresh state starts at 0: park it once it exists

    # ---- checkpoints

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        """Return the callback's progress as JSON-safe values (history, reward window, schedule state)."""
        return _json_safe(
            {
                "class": type(self).__name__,
                "returns": list(self.returns),
                "episodes": self.episodes,
                "rows": self._rows,
                "events": self._events,
                "last_log": self._last_log,
                "start_step": self.start_step,
                "total_steps": self.total_steps,
                "extra": self._extra_state(),
            }
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the progress saved by :meth:`state_dict` (before or after the callback meets a model)."""
        if state.get("class") != type(self).__name__:
            raise ValueError(f"state was saved by {state.get('class')!r}, not {type(self).__name__!r}")
        self.returns = deque(state["returns"], maxlen=self.reward_window)
        self.episodes = int(state["episodes"])
        self._rows = [
            {k: (float("nan") if k == "mean_reward" and v is None else v) for k, v in row.items()}
            for row in state["rows"]
        ]
        self._events = [
            {k: (float("nan") if k == "mean_shift" and v is None else v) for k, v in row.items()}
            for row in state["events"]
        ]
        self._last_log = state["last_log"]
        self.start_step = int(state["start_step"])
        self.total_steps = state["total_steps"]
        self._load_extra_state(state["extra"])


def _config_from(config: GSTConfig | None, kwargs: dict[str, Any]) -> tuple[GSTConfig | None, dict[str, Any]]:
    """Return a full config (or None while total_steps is unknown) and the validated keyword arguments."""
    names = [f.name for f in fields(GSTConfig)]
    if config is not None:
        if kwargs:
            raise ValueError(
                f"pass either a GSTConfig or its fields as keywords, not both (got {sorted(kwargs)})"
            )
        if not isinstance(config, GSTConfig):
            raise TypeError(f"config must be a GSTConfig, got {type(config).__name__}")
        return config, {}
    unknown = sorted(set(kwargs) - set(names))
    if unknown:
        raise ValueError(f"unknown GST setting(s) {unknown}; GSTConfig's fields are {names}")
    kwargs = dict(kwargs)
    sparsity = kwargs.get("sparsity")
    if isinstance(sparsity, dict):
        kwargs["sparsity"] = RewardAwareConfig(**sparsity)
    if "total_steps" in kwargs:
        return GSTConfig(**kwargs), kwargs
    GSTConfig(total_steps=1, **kwargs)  # validate everything else now, not at the first step
    return None, kwargs


class GSTCallback(CompressionCallback):
    """GST during SB3 training: block-circulant from step 0, then reward-aware magnitude pruning.

    Paper: https://arxiv.org/abs/2101.09650. Give a :class:`rlq.compress.GSTConfig` or its fields as
    keywords; ``total_steps`` may be left out and is then the ``total_timesteps`` of the first ``learn``
    call. Fields (see :mod:`rlq.compress.gst` for the timeline; OUR DESIGN where the paper is silent):

    - ``block_schedule``: ``(fraction, B)`` pairs, e.g. ``((0.0, 4), (0.25, 2))`` for block4-to-block2.
    - ``transition_method``: ``"exact"`` (zero parameter shift; needs plain, non-overlapping chains) or
      ``"projection"`` (works for every policy).
    - ``bc_end``: fraction of training at which the block-circulant weights are handed over to pruning.
    - ``s_shift``: the pruning target starts to rise at ``s_shift * bc_end`` of training (0.25 or 1.0 in
      the paper).
    - ``prune_every``: environment steps between updates of the reward-aware target.
    - ``handover``: ``"keep_ratio"`` (compression continuous) or ``"exact"`` (function continuous).
    - ``sparsity``: a :class:`rlq.compress.RewardAwareConfig` or a dict of its fields (max_sparsity,
      step_size, backoff, window, tolerance, abs_tolerance, cooldown).
    - ``skip_first_last``, ``scope``: which layers, and per-layer or global magnitude ranking.

    ``networks`` is chosen by the callback from the SB3 policy (leave it at its default). Other knobs:
    ``reward_window``, ``log_every``, ``cache_rollouts`` and ``verbose`` as in :class:`CompressionCallback`.
    """

    checkpoint_key = "gst"

    def __init__(
        self,
        config: GSTConfig | None = None,
        *,
        reward_window: int = 10,
        log_every: int = 1000,
        cache_rollouts: bool = True,
        verbose: int = 0,
        **config_kwargs: Any,
    ):
        full, self._config_kwargs = _config_from(config, config_kwargs)
        base = full if full is not None else GSTConfig(total_steps=1, **self._config_kwargs)
        if base.networks != "sequential":
            raise ValueError(
                "GSTCallback finds the networks of an SB3 policy itself (rlq.sb3.networks.layer_chains); "
                f"leave GSTConfig.networks at its default, got {base.networks!r}"
            )
        super().__init__(base.skip_first_last, reward_window, log_every, cache_rollouts, verbose)
        self.config = full
        self.schedule: GSTSchedule | None = GSTSchedule(full) if full is not None else None
        self._pending_schedule: dict[str, Any] | None = None
        if full is not None:
            self.total_steps = full.total_steps

    def _setup(self) -> None:
        if self.schedule is None:
            settings = {"start_step": min(self.start_step, int(self.total_steps) - 1), **self._config_kwargs}
            self.config = GSTConfig(total_steps=int(self.total_steps), **settings)
            self.schedule = GSTSchedule(self.config)
        if self._pending_schedule is not None:
            pending, self._pending_schedule = self._pending_schedule, None
            self._load_extra_state(pending)
        layers = self._require_layers()
        if not layers.eligible:
            raise ValueError(
                f"{type(self.model.policy).__name__} has no layer to compress: every layer is the first or "
                "last of its chain; use a deeper net_arch or skip_first_last=False"
            )
        if self.config.transition_method == "exact" and len(self.config.block_schedule) > 1:
            check_exact_transitions(layers)

    def _act(self) -> bool:
        updates = self.schedule.controller.updates, self.schedule.last_prune_step
        actions = self.schedule.step(self.num_timesteps, self.mean_reward)
        if actions:
            with self._changing_structure():
                for action in actions:
                    self._execute(action)
        if actions:
            self._log("+".join(a.kind for a in actions))
        elif (self.schedule.controller.updates, self.schedule.last_prune_step) != updates:
            self._log("hold")  # the target was updated and did not change: show the pause in the history
        return bool(actions) or self._last_log == self.num_timesteps

    def _execute(self, action: GSTAction) -> None:
        policy = self.model.policy
        if action.kind == "block_circulant":
            names = self._block_circulant_(action.block_size)
            self._reset_optimizers_()
            self._record_event("block_circulant", names, block_size=action.block_size)
        elif action.kind == "transition":
            names, shifts = self._transition_(action.block_size, action.method)
            self._reset_optimizers_()
            self._record_event(
                "transition", names, shifts, block_size=action.block_size, method=action.method
            )
        elif action.kind == "hand_over":
            names = remove_block_circulant_(policy, keep_pruning=True)
            if action.method == "keep_ratio" and action.sparsity > 0:
                self._prune_(action.sparsity, self.config.scope)
            self._mirror_targets_()
            self._reset_optimizers_()
            self._record_event(
                "hand_over",
                names,
                block_size=action.block_size,
                sparsity=action.sparsity,
                method=action.method,
            )
        elif action.kind == "prune":
            names = self._prune_(action.sparsity, self.config.scope)
            self._record_event("prune", names, sparsity=action.sparsity)
        else:
            raise ValueError(f"unknown GST action {action.kind!r}")

    def _block_circulant_(self, block_size: int) -> list[str]:
        layers = self._require_layers()
        done = []
        for name in layers.eligible:
            layer = layers.online[name]
            out_units, in_units = layer.weight.shape[:2]
            if out_units % block_size or in_units % block_size:
                layers.reasons[name] = f"B={block_size} does not divide its {out_units}x{in_units} weight"
                continue
            if is_block_circulant(layer):
                continue
            make_block_circulant_(layer, block_size)
            if name in layers.targets:
                make_block_circulant_(layers.targets[name], block_size)
            done.append(name)
        return done

    def _transition_(self, block_size: int, method: str) -> tuple[list[str], list[float]]:
        layers = self._require_layers()
        if method == "projection":
            report = transition_projection_(self.model.policy, block_size)
            self._mirror_targets_()
            names = [n for n in report.compressed if n in layers.online]
            return names, [report.shift[n] for n in names]
        names, shifts = [], []
        for chain_name, chain in layers.chains.items():
            sizes = {block_size_of(layers.online[n]) for n in chain} - {None}
            if not sizes:
                continue
            (current,) = sizes
            if current == block_size:
                continue
            factor = current // block_size
            result = split_blocks_exact_([layers.online[n] for n in chain], factor)
            if chain_name in layers.target_chains:
                split_blocks_exact_(layers.target_chains[chain_name], factor)
            for name, shift in zip(chain, result, strict=True):
                if shift is not None:
                    names.append(name)
                    shifts.append(shift)
        return names, shifts

    def _status(self) -> dict[str, Any]:
        schedule = self.schedule
        step = self.num_timesteps
        return {
            "phase": schedule.phase(step),
            "block_size": schedule.block_size_at(step),
            "target_sparsity": schedule.controller.target,
            "sparsity": schedule.applied_sparsity,
            "decision": schedule.controller.last_decision,
        }

    def _extra_state(self) -> dict[str, Any]:
        state = self.schedule.state_dict() if self.schedule is not None else None
        return {"schedule": state, "config": _config_dict(self.config) if self.config is not None else None}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        if self.schedule is None:  # total_steps comes from the first learn(): restore once it is known
            self._pending_schedule = state
            return
        saved = state.get("config")
        if saved is not None and self.config is not None and saved != _config_dict(self.config):
            raise ValueError(
                "the saved GST state was made with another configuration; resume with the same settings.\n"
                f"saved:   {saved}\ncurrent: {_config_dict(self.config)}"
            )
        if state.get("schedule") is not None:
            self.schedule.load_state_dict(state["schedule"])


def _config_dict(config: GSTConfig) -> dict[str, Any]:
    return json.loads(json.dumps(_json_safe(asdict(config))))


class GradualPruningCallback(CompressionCallback):
    """Zhu & Gupta's gradual magnitude pruning during SB3 training (the iterative-pruning baseline of GST).

    Paper: https://arxiv.org/abs/1710.01878, eq. 1: ``s_t = s_f + (s_i - s_f)(1 - (t - t0)/(t1 - t0))^3``
    between ``t0`` and ``t1`` at ``start_fraction`` and ``end_fraction`` of training, updated every
    ``update_every`` steps. Fractions are of the training updates, ``[learning_starts, T)`` for off-policy
    algorithms (nothing is trained before ``learning_starts``), as :class:`GSTCallback` counts them, so
    "pruning starts at 20% of training" holds whatever ``learning_starts`` is. The timeline is
    :class:`rlq.compress.GradualPruning`'s (``schedule``, made when training starts). Knobs:

    - ``final_sparsity``: ``s_f`` of the eligible layers (0.8-0.95 common in deep RL).
    - ``start_fraction``, ``end_fraction``: ``t0`` and ``t1`` as fractions of training (RL: 0.2 and 0.8).
    - ``update_every``: steps between two mask updates (Δt; default: 1% of ``t1 - t0``).
    - ``total_steps``: ``T`` (default: ``total_timesteps`` of the first ``learn`` call).
    - ``initial_sparsity``: ``s_i``; ``scope``: ``"layer"`` or ``"global"`` magnitude ranking.
    - ``skip_first_last``, ``reward_window``, ``log_every``, ``cache_rollouts``, ``verbose``: as in
      :class:`CompressionCallback`.

    Targets get the online networks' masks at every update, so their pruned weights stay exactly zero.
    """

    checkpoint_key = "gradual_pruning"

    def __init__(
        self,
        final_sparsity: float,
        start_fraction: float = 0.2,
        end_fraction: float = 0.8,
        update_every: int | None = None,
        total_steps: int | None = None,
        initial_sparsity: float = 0.0,
        scope: str = "layer",
        skip_first_last: bool = True,
        reward_window: int = 10,
        log_every: int = 1000,
        cache_rollouts: bool = True,
        verbose: int = 0,
    ):
        super().__init__(skip_first_last, reward_window, log_every, cache_rollouts, verbose)
        if update_every is not None:
            check_positive_int("update_every", update_every)
        # validated now, not at the first step; total_steps and start_step are known when training starts
        self._settings = GradualPruningConfig(
            total_steps=1,
            final_sparsity=final_sparsity,
            start_fraction=start_fraction,
            end_fraction=end_fraction,
            prune_every=update_every,
            initial_sparsity=initial_sparsity,
            skip_first_last=skip_first_last,
            scope=scope,
        )
        if total_steps is not None:
            self.total_steps = check_positive_int("total_steps", total_steps)
        self.schedule: GradualPruning | None = None
        self.applied_sparsity = 0.0
        self.pruned = False

    def _require_schedule(self) -> GradualPruning:
        if self.schedule is None:
            raise RuntimeError("the schedule is made when training starts: call model.learn(...) first")
        return self.schedule

    @property
    def start(self) -> int:
        """Return ``t0``, the step at which pruning starts."""
        return self._require_schedule().start_step

    @property
    def end(self) -> int:
        """Return ``t1``, the step at which the final sparsity is reached."""
        return self._require_schedule().end_step

    @property
    def every(self) -> int:
        """Return Δt, the steps between mask updates."""
        return self._require_schedule().every

    def target_sparsity(self, step: int) -> float:
        """Return the schedule's sparsity at ``step``."""
        return self._require_schedule().target(step)

    def _setup(self) -> None:
        self.schedule = GradualPruning(
            replace(self._settings, total_steps=int(self.total_steps), start_step=self.start_step)
        )
        if not self._require_layers().eligible:
            raise ValueError(
                f"{type(self.model.policy).__name__} has no layer to prune: every layer is the first or "
                "last of its chain; use a deeper net_arch or skip_first_last=False"
            )

    def _act(self) -> bool:
        step = self.num_timesteps
        if step < self.start:
            return False
        target = self.target_sparsity(step)
        if self.pruned and target == self.applied_sparsity:
            return False
        with self._changing_structure():
            names = self._prune_(target, self._settings.scope)
        self.applied_sparsity, self.pruned = target, True
        self._record_event("prune", names, sparsity=target)
        self._log("prune")
        return True

    def _status(self) -> dict[str, Any]:
        step = self.num_timesteps
        return {
            "phase": "pruning" if self.pruned else "dense",
            "block_size": None,
            "target_sparsity": self.target_sparsity(step)
            if step >= self.start
            else self._settings.initial_sparsity,
            "sparsity": self.applied_sparsity,
            "decision": None,
        }

    def _extra_state(self) -> dict[str, Any]:
        return {"applied_sparsity": self.applied_sparsity, "pruned": self.pruned}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.applied_sparsity = float(state["applied_sparsity"])
        self.pruned = bool(state["pruned"])


# --------------------------------------------------------------------------------------------------------
# One training run per method, with checkpoints


@dataclass
class CompressedRun:
    """One training run with a compression method, as the GST notebooks use it."""

    method: str
    model: Any
    callback: CompressionCallback
    curve: pd.DataFrame
    wall_time_s: float
    resumed_from: int | None

    @property
    def history(self) -> pd.DataFrame:
        """Return the callback's history (see :data:`HISTORY_COLUMNS`)."""
        return self.callback.history

    @property
    def average_compression_ratio(self) -> float:
        """Return the compression ratio averaged over the training updates."""
        return self.callback.average_compression_ratio()

    def summary(self, last_episodes: int = 10) -> dict[str, Any]:
        """Return the run's headline numbers as one table row.

        ``final_train_return`` is the mean return of the last ``last_episodes`` training episodes.
        """
        history = self.history
        returns = self.curve["episode_return"].tail(last_episodes)
        return {
            "method": self.method,
            "timesteps": int(self.model.num_timesteps),
            "avg_compression_ratio": self.average_compression_ratio,
            "start_compression_ratio": float(history["compression_ratio"].iloc[0]),
            "final_compression_ratio": float(history["compression_ratio"].iloc[-1]),
            "covered_fraction": self.callback.covered_fraction,
            "final_train_return": float(returns.mean()) if len(returns) else float("nan"),
            "episodes": len(self.curve),
            "wall_time_s": self.wall_time_s,
        }


def make_callback(
    method: str,
    gst: dict[str, Any] | None = None,
    pruning: dict[str, Any] | None = None,
    reward_window: int = 10,
    log_every: int = 1000,
) -> CompressionCallback:
    """Return the callback of ``method``: ``"dense"`` (records only), ``"pruning"`` or ``"gst"``.

    ``gst`` holds :class:`GSTCallback`'s settings (GSTConfig fields), ``pruning`` those of
    :class:`GradualPruningCallback` (``final_sparsity`` required).
    """
    common = dict(reward_window=reward_window, log_every=log_every)
    if method == "dense":
        return CompressionCallback(**common)
    if method == "gst":
        return GSTCallback(**common, **(gst or {}))
    if method == "pruning":
        settings = dict(pruning or {})
        if "final_sparsity" not in settings:
            raise ValueError("the pruning method needs pruning={'final_sparsity': ...}")
        return GradualPruningCallback(**settings, **common)
    raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")


def train_compressed(
    method: str,
    algo: str,
    env_id: str,
    total_timesteps: int,
    *,
    seed: int = 0,
    n_envs: int = 1,
    hyperparams: dict[str, Any] | None = None,
    policy: str | None = None,
    run_dir: str | Path | None = None,
    checkpoint_every: int = 0,
    gst: dict[str, Any] | None = None,
    pruning: dict[str, Any] | None = None,
    reward_window: int = 10,
    log_every: int = 1000,
    callbacks: list[BaseCallback] | None = None,
    env_kwargs: dict[str, Any] | None = None,
) -> CompressedRun:
    """Return a run of ``algo`` on ``env_id`` trained with compression ``method`` (see :func:`make_callback`).

    Training goes through :func:`rlq.agents.train_agent` with compressed checkpoints
    (:func:`rlq.sb3.checkpoint.save_compressed`) every ``checkpoint_every`` steps into ``run_dir``; calling
    it again with the same ``run_dir`` resumes from the newest checkpoint, schedule state included.
    ``callbacks`` run after the compression callback (e.g. live progress in :mod:`rlq.widgets`);
    ``env_kwargs`` go to every env made (:func:`rlq.envs.make_vec_env`).
    """
    from rlq.agents import train_agent
    from rlq.sb3.checkpoint import load_compressed, save_compressed

    callback = make_callback(method, gst, pruning, reward_window, log_every)
    result = train_agent(
        algo,
        env_id,
        total_timesteps,
        seed=seed,
        n_envs=n_envs,
        hyperparams=hyperparams,
        run_dir=run_dir,
        checkpoint_every=checkpoint_every,
        callback=[callback, *(callbacks or [])],
        policy=policy,
        save_model=save_compressed,
        load_model=load_compressed,
        env_kwargs=env_kwargs,
    )
    if callback.layers is None:  # a finished run resumed: learn() did not run, attach the model for measures
        callback.init_callback(result.model)
    return CompressedRun(
        method, result.model, callback, result.curve, result.wall_time_s, result.resumed_from
    )


def train_and_evaluate(
    method: str,
    algo: str,
    env_id: str,
    total_timesteps: int,
    *,
    seed: int = 0,
    eval_episodes: int = 5,
    eval_seed: int | None = None,
    torch_threads: int | None = None,
    keys: dict[str, Any] | None = None,
    last_episodes: int = 10,
    eval_deterministic: bool = True,
    **train_kwargs: Any,
) -> dict[str, Any]:
    """Return one run's tables as plain data: ``summary`` (a row), ``history``, ``curve``, ``events``, ``layers``.

    :func:`train_compressed` (same arguments; it resumes from ``run_dir``) followed by a deterministic
    evaluation (``eval_deterministic``) of ``eval_episodes`` episodes (seeded ``eval_seed``, default ``seed + 10_000``; 0 episodes
    skips it); ``last_episodes`` training episodes make the summary's ``final_train_return``. Every table
    carries the ``keys`` columns (e.g. env id, seed, method). Picklable, so
    :func:`rlq.parallel.run_jobs` can run it in worker processes; ``torch_threads`` sets the thread count
    of the process that trains.
    """
    from rlq.evaluate import evaluate

    if torch_threads is not None:
        torch.set_num_threads(check_positive_int("torch_threads", torch_threads))
    run = train_compressed(method, algo, env_id, total_timesteps, seed=seed, **train_kwargs)
    keys = dict(keys or {})
    summary = {**keys, **run.summary(last_episodes=last_episodes)}
    if eval_episodes:
        result = evaluate(
            run.model,
            env_id,
            n_episodes=eval_episodes,
            seed=seed + 10_000 if eval_seed is None else eval_seed,
        )
        summary |= {"eval_return": result.mean, "eval_std": result.std}
    summary |= {"resumed_from": run.resumed_from}
    return {
        "summary": summary,
        "history": run.history.assign(**keys),
        "curve": run.curve.assign(**keys),
        "events": run.callback.events.assign(**keys),
        "layers": run.callback.layer_report().assign(**keys),
    }


RUN_TABLES = ("summary", "history", "curve", "events")
"""Tables :func:`train_and_evaluate_all` gathers over runs and writes as CSV (``layers`` stays per run)."""


def train_and_evaluate_all(
    jobs: Sequence[dict[str, Any]],
    *,
    workers: int = 1,
    out: str | Path | None = None,
    on_result: Callable[[int, dict[str, Any]], None] | None = None,
    tables: Sequence[str] = RUN_TABLES,
) -> tuple[list[dict[str, Any]], dict[str, pd.DataFrame]]:
    """Return every run's result and the runs' tables stacked (:data:`RUN_TABLES`), after training them all.

    Runs :func:`train_and_evaluate` on each job (keyword arguments) in ``workers`` processes through
    :func:`rlq.parallel.run_jobs`, calling ``on_result(index, result)`` as each finishes. ``summary`` has
    one row per run; the other tables stack every run's rows (each carries its job's ``keys`` columns).
    ``tables`` picks which of them to gather. With ``out``, each is also written to ``out/<name>.csv``:
    the top-level CSVs of a run folder are what ``rlq publish`` commits.
    """
    unknown = sorted(set(tables) - set(RUN_TABLES))
    if unknown:
        raise ValueError(f"unknown table(s) {unknown}; the tables of a run are {list(RUN_TABLES)}")
    results = run_jobs(train_and_evaluate, jobs, workers=workers, on_result=on_result)
    stacked: dict[str, pd.DataFrame] = {}
    for name in tables:
        if name == "summary":
            stacked[name] = pd.DataFrame([r["summary"] for r in results])
        else:
            stacked[name] = (
                pd.concat([r[name] for r in results], ignore_index=True) if results else pd.DataFrame()
            )
    if out is not None:
        for name, table in stacked.items():
            table.to_csv(Path(out) / f"{name}.csv", index=False)
    return results, stacked
