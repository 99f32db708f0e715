"""What every compression callback shares in Stable-Baselines3 training (TD3, SAC, DDPG, A2C, PPO, DQN).

:class:`CompressionCallback` records the compression ratio and training reward (the dense baseline's
recorder); :class:`rlq.sb3.gst_callback.GSTCallback` and :class:`rlq.sb3.pruning_callback.GradualPruningCallback` add GST
and its iterative-pruning baseline.

Paper: Lee et al., "GST: Group-Sparse Training for Accelerating Deep Reinforcement Learning",
arXiv 2101.09650 (https://arxiv.org/abs/2101.09650). Baseline: Zhu & Gupta, "To prune, or not to prune",
arXiv 1710.01878 (gradual magnitude pruning, eq. 1).

    from rlq.sb3.gst_callback import GSTCallback
    from rlq.sb3.pruning_callback import GradualPruningCallback
    gst = GSTCallback(block_schedule=((0.0, 4), (0.25, 2)), s_shift=0.25, bc_end=0.5, prune_every=1000)
    model.learn(100_000, callback=gst)
    gst.history                      # one row per action and every ``log_every`` steps
    gst.average_compression_ratio()  # GST's headline measure

The timeline (block-circulant from step 0, block-size transitions, S_shift, the hand-over to pruning) and
the reward-aware target are :class:`rlq.compress.GSTSchedule` and :class:`rlq.compress.RewardAwareSparsity`;
the reward-aware rule, S_shift's meaning and the exact transition are OUR DESIGN (the paper does not
publish them). GST's schedule carries out its own actions (:meth:`rlq.compress.GSTSchedule.execute_`); this
module supplies what only SB3 knows, as :class:`rlq.compress.gst.GSTHooks` and layer names:

- **Layers.** Networks are found per SB3 network with :func:`rlq.sb3.networks.layer_chains`. A layer is
  eligible when it belongs to an online chain and (with ``skip_first_last``) is neither the first nor the
  last layer of any chain: SAC's trunk feeding two heads and a CNN shared by actor and critic are handled.
  ``covered_fraction`` is the share of the online networks' weights held by eligible layers (paper: 94-99%).
- **Targets and optimizers.** Target networks get the same structure and masks as their online networks
  at every change, and the optimizer state a change invalidates is reset, that of masked entries parked
  (:mod:`rlq.sb3.policy_sync`).
- **Reward.** Finished episodes are read from ``self.locals["infos"]`` (Monitor's ``"episode"`` entries).
  GST's controller gets each finished episode's return as a score (those that began in an off-policy
  algorithm's random warm-up left out, :meth:`rlq.compress.GSTSchedule.counts_episode`); the history's
  ``mean_reward`` is the mean return of the last ``reward_window`` episodes.
- **Compression ratio.** ``1 - stored / dense`` weights (biases excluded) over every Linear/Conv layer of
  the *online* networks. Target networks mirror them, so the ratio over the whole policy, targets
  included, is the same number. :meth:`CompressionCallback.average_compression_ratio` averages it over
  the training updates: from ``learning_starts`` (off-policy; 0 on-policy) to the end. The history and
  event rows are :class:`rlq.sb3.compression_history.CompressionHistory`'s.
- **Checkpoints.** Each callback has a ``checkpoint_key`` and ``state_dict``/``load_state_dict`` (schedule,
  controller, reward window, history), used by :func:`rlq.sb3.checkpoint.save_compressed` and by
  :class:`rlq.rl.resume.Checkpoints`, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from torch import nn
from torch.nn.utils import parametrize

from rlq.compress import layer_report, magnitude_prune_
from rlq.compress.layers import dense_weight_numel
from rlq.compress.measures import stored_weight_count
from rlq.core.jsonio import json_safe
from rlq.core.validation import check_positive_int
from rlq.rl.episodes import finished_episodes
from rlq.sb3.compression_history import CompressionHistory
from rlq.sb3.networks import PolicyLayers, policy_layers
from rlq.sb3.policy_sync import (
    mirror_target_masks_,
    online_mask,
    park_masked_optimizer_state_,
    reset_policy_optimizers_,
)
from rlq.sb3.qat_stacking import fake_quant_lifted

# Callbacks


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
        self._record = CompressionHistory()
        self._last_log: int | None = None
        self._last_park: int | None = None
        self._park_pending = False
        self._finished: list[tuple[float, int]] = []
        """``(return, length)`` of the episodes that finished at this step (read by :meth:`_act`)."""
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
        if self._record.last_step != self.num_timesteps:
            self._log("start")

    def _on_step(self) -> bool:
        self._finished = finished_episodes(self.locals.get("infos"))
        for episode_return, _ in self._finished:
            self.returns.append(episode_return)
            self.episodes += 1
        acted = self._act()
        self._finished = []
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
        """Change the compression inside: a rollout's parametrization cache is dropped, then reopened.

        QAT's weight quantizers, if a :class:`rlq.sb3.qat_callback.QATCallback` trains alongside, are lifted off
        during the change and stacked back on top of the new structure
        (:func:`rlq.sb3.qat_stacking.fake_quant_lifted`).
        """
        was_open = self._rollout_cache is not None
        self.close_rollout_cache()
        try:
            with fake_quant_lifted(self.model.policy):  # QAT (if any) returns on top of the new structure
                yield
        finally:
            if was_open:
                self._rollout_cache = parametrize.cached()
                self._rollout_cache.__enter__()

    def _on_training_end(self) -> None:
        self.close_rollout_cache()
        if self._record.last_step != self.num_timesteps:
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
        start = self.start_step if start_step is None else int(start_step)
        return self._record.average_compression_ratio(start, end_step, self.total_steps)

    @property
    def history(self) -> pd.DataFrame:
        """Return the history rows as a DataFrame (:data:`rlq.sb3.compression_history.HISTORY_COLUMNS`)."""
        return self._record.frame()

    @property
    def events(self) -> pd.DataFrame:
        """Return one row per action carried out (:data:`rlq.sb3.compression_history.EVENT_COLUMNS`)."""
        return self._record.event_frame()

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
        self._record.add_row(row)
        self._record_to_logger(row)
        if self.verbose >= 1 and event not in ("log",):
            self.logger.log(
                f"[{type(self).__name__}] step {row['step']}: {event}, ratio {row['compression_ratio']:.3f}"
            )

    def _record_to_logger(self, row: dict[str, Any]) -> None:
        """Give SB3's logger the compression state (TensorBoard and CSV, at SB3's next dump)."""
        self.logger.record("compression/ratio", row["compression_ratio"])
        self.logger.record("compression/target_sparsity", row["target_sparsity"])
        self.logger.record("compression/sparsity", row["sparsity"])
        if row["block_size"] is not None:
            self.logger.record("gst/block_size", row["block_size"])
        if row["decision"] is not None:
            self.logger.record("gst/decision", row["decision"], exclude=("stdout", "log", "csv"))

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
        self._record.add_event(row)

    def _prune_(self, sparsity: float, scope: str, block: tuple[int, int] | None = None) -> list[str]:
        """Prune the eligible online layers to ``sparsity`` by magnitude (whole ``block``s when given) and
        give targets the same masks."""
        layers = self._require_layers()
        previous = {
            name: mask.clone() for name in layers.eligible if (mask := self._mask_of(name)) is not None
        }
        how = {} if block is None else {"block": block}
        report = magnitude_prune_(self.model.policy, sparsity, scope=scope, layers=layers.eligible, **how)
        self._after_prune_(previous)
        return report.compressed

    def _after_prune_(self, previous: dict[str, torch.Tensor]) -> None:
        """Give targets the online layers' new masks and park the masked entries' optimizer state."""
        self._mirror_targets_()
        self._park_masked_state_(previous)

    def _after_structure_change_(self, changed: Sequence[torch.Tensor] | None = None) -> None:
        """Check and mirror the targets' masks, then drop the optimizer state of ``changed`` (None: all)."""
        self._mirror_targets_()
        self._reset_optimizers_(changed)

    def _mirror_layer_(self, name: str, transform: Callable[[nn.Module], object]) -> None:
        """Apply ``transform``, which online layer ``name`` just went through, to its target twin, if any."""
        twin = self._require_layers().targets.get(name)
        if twin is not None:
            transform(twin)

    def _mirror_chain_(self, chain: str, transform: Callable[[list[nn.Module]], object]) -> None:
        """Apply ``transform``, which online chain ``chain`` just went through, to its target chain, if any."""
        twins = self._require_layers().target_chains.get(chain)
        if twins is not None:
            transform(twins)

    def _mask_of(self, name: str) -> torch.Tensor | None:
        """Return the mask on online layer ``name``'s stored values (weights or B-vectors), if pruned."""
        return online_mask(self._require_layers(), name)

    def _park_masked_state_(self, previous: dict[str, torch.Tensor] | None = None) -> None:
        """Park the optimizer state of masked entries (and zero it where a mask regrew entries).

        Until every masked parameter has optimizer state (optimizers create it at their first step after
        a reset), parking is repeated at every environment step
        (:func:`rlq.sb3.policy_sync.park_masked_optimizer_state_`).
        """
        complete = park_masked_optimizer_state_(self.model.policy, self._require_layers(), previous)
        self._last_park = self.num_timesteps
        self._park_pending = not complete

    def _mirror_targets_(self) -> None:
        """Give every target layer its online layer's mask (:func:`rlq.sb3.policy_sync.mirror_target_masks_`)."""
        mirror_target_masks_(self._require_layers())

    def _reset_optimizers_(self, changed: Sequence[torch.Tensor] | None = None) -> None:
        """Drop the optimizer state of ``changed`` parameters (None: all of the policy's) after a structural change."""
        reset_policy_optimizers_(self.model.policy, changed)
        self._park_pending = True  # masked entries' fresh state starts at 0: park it once it exists

    # ---- checkpoints

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        """Return the callback's progress as JSON-safe values (history, reward window, schedule state)."""
        return json_safe(
            {
                "class": type(self).__name__,
                "returns": list(self.returns),
                "episodes": self.episodes,
                "rows": self._record.rows,
                "events": self._record.events,
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
        self._record.load_rows(state["rows"], state["events"])
        self._last_log = state["last_log"]
        self.start_step = int(state["start_step"])
        self.total_steps = state["total_steps"]
        self._load_extra_state(state["extra"])
