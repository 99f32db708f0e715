"""Zhu & Gupta's gradual magnitude pruning as a schedule object: the iterative-pruning baseline of GST.

Paper: Zhu & Gupta, "To prune, or not to prune", arXiv 1710.01878 (https://arxiv.org/abs/1710.01878), eq. 1:
``s_t = s_f + (s_i - s_f)(1 - (t - t0)/(t1 - t0))^3`` between ``t0`` and ``t1``, updated every Δt steps.
:class:`GradualPruning` has :class:`rlq.compress.GSTSchedule`'s interface (``apply_``, ``state_dict``), so a
training loop runs either; :class:`rlq.sb3.pruning_callback.GradualPruningCallback` uses its timeline inside SB3.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch import nn

from rlq.compress.gst import GSTAction, fraction_step
from rlq.compress.layers import Networks
from rlq.compress.pruning import SCOPES, check_block_shape, check_sparsity, gradual_sparsity, magnitude_prune_
from rlq.core.validation import check_positive_int


@dataclass
class GradualPruningConfig:
    """Knobs of :class:`GradualPruning`; fractions are of the training steps ``[start_step, total_steps)``."""

    total_steps: int
    """Steps of the whole run (optimizer steps, or environment steps for RL)."""
    final_sparsity: float = 0.8
    """Sparsity of the eligible layers at the end of the ramp (Zhu & Gupta's s_f)."""
    start_fraction: float = 0.2
    """Fraction of training at which pruning starts (t0; 20% is the common RL setting)."""
    end_fraction: float = 0.8
    """Fraction of training at which the final sparsity is reached (t1; 80%)."""
    prune_every: int | None = None
    """Steps between two mask updates (Δt); None: 1% of ``t1 - t0``."""
    initial_sparsity: float = 0.0
    """Sparsity at ``t0`` (s_i)."""
    start_step: int = 0
    """Step of the first training update (SB3 off-policy: ``learning_starts``); fractions count from here."""
    skip_first_last: bool = True
    """Keep the first and last layer dense, as GST does."""
    networks: Networks = "whole"
    """How layers group into networks (see :func:`rlq.compress.find_networks`)."""
    scope: str = "layer"
    """``"layer"``: every eligible layer at the same sparsity; ``"global"``: one magnitude threshold."""
    prune_block: tuple[int, int] | None = None
    """Prune whole ``(rows, inputs)`` blocks by L2 norm (rlq's design, see :mod:`rlq.compress.pruning`), e.g.
    :data:`rlq.compress.pruning.DEPLOY_BLOCK`; None: single entries by magnitude."""

    def __post_init__(self) -> None:
        check_positive_int("total_steps", self.total_steps)
        for name in ("start_fraction", "end_fraction"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        if self.start_fraction > self.end_fraction:
            raise ValueError(
                f"start_fraction {self.start_fraction} must not exceed end_fraction {self.end_fraction}"
            )
        check_sparsity(self.final_sparsity, "final_sparsity")
        check_sparsity(self.initial_sparsity, "initial_sparsity")
        if self.initial_sparsity > self.final_sparsity:
            raise ValueError(
                f"initial_sparsity {self.initial_sparsity} exceeds final_sparsity {self.final_sparsity}"
            )
        if self.prune_every is not None:
            check_positive_int("prune_every", self.prune_every)
        if isinstance(self.start_step, bool) or not isinstance(self.start_step, int) or self.start_step < 0:
            raise ValueError(f"start_step must be an int >= 0, got {self.start_step!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {self.scope!r}")
        self.prune_block = check_block_shape(self.prune_block)


class GradualPruning:
    """Zhu & Gupta (2017) gradual magnitude pruning with :class:`rlq.compress.GSTSchedule`'s interface.

    Dense until ``t0``, then every Δt steps the eligible layers are magnitude-pruned to the cubic target,
    reaching ``final_sparsity`` at ``t1``. The reward is ignored (the schedule is fixed): that is the
    baseline GST is compared with.
    """

    def __init__(self, config: GradualPruningConfig):
        self.config = config
        self.applied_sparsity = 0.0

    def step_of(self, fraction: float) -> int:
        """Return the step at ``fraction`` of training (of the steps from ``start_step`` to the end)."""
        start = min(self.config.start_step, self.config.total_steps)
        return fraction_step(fraction, self.config.total_steps, start)

    @property
    def start_step(self) -> int:
        """Return ``t0``, the step at which pruning starts."""
        return self.step_of(self.config.start_fraction)

    @property
    def end_step(self) -> int:
        """Return ``t1``, the step at which the final sparsity is reached."""
        return self.step_of(self.config.end_fraction)

    @property
    def every(self) -> int:
        """Return Δt, the steps between two mask updates."""
        return self.config.prune_every or max(1, (self.end_step - self.start_step) // 100)

    def target(self, step: int) -> float:
        """Return the sparsity the schedule prescribes at ``step``."""
        c = self.config
        return gradual_sparsity(
            step, c.final_sparsity, self.start_step, self.end_step, c.initial_sparsity, self.every
        )

    def phase(self, step: int) -> str:
        """Return ``"dense"``, ``"pruning"`` or ``"pruned"`` at ``step``."""
        return "dense" if step < self.start_step else "pruning" if step < self.end_step else "pruned"

    def apply_(
        self, module: nn.Module, step: int, scores: Iterable[float] = (), optimizers: Any = ()
    ) -> list[GSTAction]:
        """Return the prune action carried out at ``step`` (none while the target is unchanged; ``scores`` unused)."""
        if step < self.start_step:
            return []
        target = self.target(step)
        if target == self.applied_sparsity:
            return []
        c = self.config
        how = {} if c.prune_block is None else {"block": c.prune_block}
        magnitude_prune_(
            module, target, skip_first_last=c.skip_first_last, scope=c.scope, networks=c.networks, **how
        )
        self.applied_sparsity = target
        return [GSTAction(step, "prune", sparsity=target)]

    def state_dict(self) -> dict[str, Any]:
        """Return the schedule's progress (the masks themselves are in the module's state_dict)."""
        return {"applied_sparsity": self.applied_sparsity}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the progress saved by :meth:`state_dict`."""
        self.applied_sparsity = float(state["applied_sparsity"])
