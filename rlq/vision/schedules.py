"""The compression schedules a classifier trains under: GST, or the pruning baseline (Zhu & Gupta).

:func:`make_schedule` builds either from the few knobs a classification experiment varies; both have the
interface :func:`rlq.vision.train_classifier` calls (:class:`CompressionSchedule`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from torch import nn

from rlq.compress import (
    GradualPruning,
    GradualPruningConfig,
    GSTAction,
    GSTConfig,
    GSTSchedule,
    RewardAwareConfig,
)

METHODS = ("dense", "pruning", "gst")
"""What :func:`make_schedule` builds: no schedule, Zhu & Gupta's gradual magnitude pruning, or GST."""


class CompressionSchedule(Protocol):
    """What :func:`train_classifier` needs of a schedule (:class:`GSTSchedule` and :class:`GradualPruning` fit)."""

    def apply_(
        self, module: nn.Module, step: int, scores: Iterable[float] = (), optimizers: Any = ()
    ) -> list[GSTAction]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def make_schedule(  # noqa: PLR0913
    method: str,
    total_steps: int,
    steps_per_epoch: int,
    *,
    block_size: int = 4,
    late_block_size: int = 0,
    transition_at: float = 0.25,
    bc_end: float = 0.5,
    s_shift: float = 1.0,
    max_sparsity: float = 0.8,
    step_size: float = 0.05,
    tolerance: float = 0.01,
    window: int = 2,
    final_sparsity: float = 0.8,
    prune_start: float = 0.2,
    prune_end: float = 0.8,
) -> CompressionSchedule | None:
    """Return the schedule of ``method`` for a classifier trained ``total_steps`` steps (None for ``"dense"``).

    ``"gst"``: block-circulant with ``block_size`` from step 0 (optionally re-projected to
    ``late_block_size`` at ``transition_at``; the exact, permutation-based transition does not apply to
    residual networks, whose channels are tied by the shortcuts), handed over to pruning at ``bc_end``,
    with S_shift = ``s_shift``; the reward-aware target (each layer's compression; the validation accuracy
    is its score, one per epoch) rises by ``step_size`` while the accuracy of the epoch after a rise stays
    within ``tolerance`` (absolute, 0.01 = 1 %p) of the mean of the ``window`` epochs before it, up to
    ``max_sparsity``, and backs off by ``step_size`` otherwise. ``"pruning"``: Zhu & Gupta's gradual magnitude pruning from ``prune_start`` to
    ``prune_end`` to ``final_sparsity``, updated once per epoch. Both keep the first and last layer dense
    (``networks="whole"``).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "dense":
        return None
    if method == "pruning":
        return GradualPruning(
            GradualPruningConfig(
                total_steps=total_steps,
                final_sparsity=final_sparsity,
                start_fraction=prune_start,
                end_fraction=prune_end,
                prune_every=steps_per_epoch,
            )
        )
    blocks: tuple[tuple[float, int], ...] = ((0.0, block_size),)
    if late_block_size and late_block_size != block_size:
        blocks += ((transition_at, late_block_size),)
    sparsity = RewardAwareConfig(
        max_sparsity=max_sparsity,
        step_size=step_size,
        backoff=step_size,
        window=window,
        tolerance=0.0,
        abs_tolerance=tolerance,
        min_episodes=1,  # one accuracy per epoch: each epoch's score judges the last change
    )
    config = GSTConfig(
        total_steps=total_steps,
        block_schedule=blocks,
        transition_method="projection",
        bc_end=bc_end,
        s_shift=s_shift,
        prune_every=steps_per_epoch,
        sparsity=sparsity,
        networks="whole",
    )
    return GSTSchedule(config)
