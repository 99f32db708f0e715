"""Zhu & Gupta's gradual magnitude pruning during Stable-Baselines3 training: GST's iterative-pruning baseline.

Paper: Zhu & Gupta, "To prune, or not to prune", arXiv 1710.01878 (eq. 1). The timeline is
:class:`rlq.compress.GradualPruning`; the callback machinery is :class:`rlq.sb3.compression.CompressionCallback`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlq.compress import (
    GradualPruning,
    GradualPruningConfig,
)
from rlq.core.validation import check_positive_int
from rlq.sb3.compression import CompressionCallback

SCHEDULE_KNOBS = (
    "start_fraction",
    "end_fraction",
    "initial_sparsity",
    "scope",
    "skip_first_last",
    "prune_block",
)
"""The :class:`rlq.compress.GradualPruningConfig` fields :class:`GradualPruningCallback` takes as keywords (the
callback sets the others: ``prune_every`` from ``update_every``, ``total_steps`` and ``start_step`` when
training starts)."""


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
    - ``prune_block``: ``(rows, inputs)`` to prune whole blocks by their L2 norm (rlq's design), e.g.
      ``rlq.compress.pruning.DEPLOY_BLOCK = (16, 4)``, the shape ``rlq.deploy``'s block-sparse kernel reads
      best (the reason is in its docstring); None (default): single weights by magnitude.
    - ``skip_first_last``, ``reward_window``, ``log_every``, ``cache_rollouts``, ``verbose``: as in
      :class:`CompressionCallback`.

    Targets get the online networks' masks at every update, so their pruned weights stay exactly zero.
    With :class:`rlq.sb3.qat_callback.QATCallback` in the same ``learn``, QAT quantizes the kept weights (see
    :mod:`rlq.sb3.qat_stacking`).
    """

    checkpoint_key = "gradual_pruning"

    def __init__(
        self,
        final_sparsity: float,
        *,
        update_every: int | None = None,
        total_steps: int | None = None,
        reward_window: int = 10,
        log_every: int = 1000,
        cache_rollouts: bool = True,
        verbose: int = 0,
        **schedule: Any,
    ):
        unknown = sorted(set(schedule) - set(SCHEDULE_KNOBS))
        if unknown:
            raise ValueError(
                f"unknown pruning setting(s) {unknown}; the schedule's are {list(SCHEDULE_KNOBS)}"
            )
        skip_first_last = schedule.get("skip_first_last", True)
        super().__init__(skip_first_last, reward_window, log_every, cache_rollouts, verbose)
        if update_every is not None:
            check_positive_int("update_every", update_every)
        # validated now, not at the first step; total_steps and start_step are known when training starts
        self._settings = GradualPruningConfig(
            total_steps=1, final_sparsity=final_sparsity, prune_every=update_every, **schedule
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
            names = self._prune_(target, self._settings.scope, self._settings.prune_block)
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
