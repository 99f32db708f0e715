"""GST's settings and the records its schedule exchanges: :class:`GSTConfig`, :class:`GSTAction`, :class:`GSTHooks`.

The timeline they configure is described in :mod:`rlq.compress.gst`; the parts the paper leaves unpublished
are OUR DESIGN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

import torch
from torch import nn

from rlq.compress.circulant import check_block_size
from rlq.compress.layers import CompressionReport, Networks
from rlq.compress.pruning import SCOPES, check_block_shape
from rlq.compress.reward_aware import RewardAwareConfig
from rlq.core.validation import check_positive_int

TRANSITION_METHODS = ("exact", "projection")
HANDOVERS = ("keep_ratio", "exact")
TARGETS = ("compression", "stored")
BC_INITS = ("scaled", "projection")
OPTIMIZER_RESETS = ("changed", "all")
_CHOICES = (
    ("transition_method", TRANSITION_METHODS),
    ("handover", HANDOVERS),
    ("scope", SCOPES),
    ("target", TARGETS),
    ("bc_init", BC_INITS),
    ("optimizer_reset", OPTIMIZER_RESETS),
)


def fraction_step(fraction: float, total_steps: int, start_step: int = 0) -> int:
    """Return the step at ``fraction`` of the training steps ``[start_step, total_steps)``."""
    return start_step + int(round(fraction * (total_steps - start_step)))


@dataclass
class GSTConfig:
    """Every knob of :class:`GSTSchedule` (fractions are of the training steps ``[start_step, total_steps)``)."""

    total_steps: int
    """Training steps of the run (environment steps or updates: whatever ``step`` counts)."""
    start_step: int = 0
    """Step of the first training update (SB3 off-policy: ``learning_starts``); fractions count from here."""
    block_schedule: tuple[tuple[float, int], ...] = ((0.0, 4),)
    """``(fraction, B)`` pairs in increasing order, the first at 0.0; e.g. ``((0.0, 4), (0.25, 2))``."""
    transition_method: str = "exact"
    """How B changes: ``"exact"`` (zero parameter shift) or ``"projection"``."""
    bc_end: float = 0.5
    """Fraction at which the block-circulant structure is handed over to pruning (1.0: never)."""
    s_shift: float = 1.0
    """The pruning target starts to rise at ``s_shift * bc_end`` (in [0, 1]; paper values 0.25 and 1.0)."""
    prune_every: int = 1000
    """Steps between two updates of the pruning target (Zhu & Gupta's Δt)."""
    handover: str = "keep_ratio"
    """``"keep_ratio"`` (compression continuous) or ``"exact"`` (function continuous) at the hand-over."""
    sparsity: RewardAwareConfig = field(default_factory=RewardAwareConfig)
    """The reward-aware target's constants."""
    skip_first_last: bool = True
    """Keep each network's first and last layer dense (the paper's selective application)."""
    networks: Networks = "sequential"
    """How layers group into networks (see :func:`rlq.compress.find_networks`)."""
    scope: str = "layer"
    """Pruning scope: ``"layer"`` or ``"global"``."""
    prune_block: tuple[int, int] | None = None
    """Prune whole ``(rows, inputs)`` blocks by L2 norm (B-vectors whole while block-circulant), e.g.
    :data:`rlq.compress.pruning.DEPLOY_BLOCK`; None: single entries by magnitude."""
    target: str = "compression"
    """What the reward-aware target is: each layer's ``"compression"`` in every phase (capped by
    ``max_sparsity``) or the ``"stored"`` values' sparsity (the ablation's ``gst_none``; over-compresses while block-circulant)."""
    bc_init: str = "scaled"
    """B-vectors at the start: ``"scaled"`` (projection with the init's Frobenius norm) or ``"projection"``."""
    optimizer_reset: str = "changed"
    """After a structural change drop the state of the ``"changed"`` parameters only, or of ``"all"``."""

    def __post_init__(self) -> None:
        check_positive_int("total_steps", self.total_steps)
        if (
            isinstance(self.start_step, bool)
            or not isinstance(self.start_step, int)
            or not (0 <= self.start_step < self.total_steps)
        ):
            raise ValueError(
                f"start_step must be an int in [0, total_steps={self.total_steps}), got {self.start_step!r}"
            )
        for name, choices in _CHOICES:
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        if not 0.0 < self.bc_end <= 1.0:
            raise ValueError(f"bc_end must be in (0, 1], got {self.bc_end}")
        if not 0.0 <= self.s_shift <= 1.0:
            raise ValueError(f"s_shift must be in [0, 1], got {self.s_shift}")
        check_positive_int("prune_every", self.prune_every)
        self.prune_block = check_block_shape(self.prune_block)
        self.block_schedule = self._checked_block_schedule()
        self._check_compression_cap()

    def _checked_block_schedule(self) -> tuple[tuple[float, int], ...]:
        """Return ``block_schedule`` as ``(float, int)`` pairs, checked against ``bc_end`` and the transition."""
        schedule = tuple((float(f), check_block_size(b)) for f, b in self.block_schedule)
        if not schedule or schedule[0][0] != 0.0:
            raise ValueError(f"block_schedule must start with (0.0, B), got {self.block_schedule!r}")
        fractions = [f for f, _ in schedule]
        if any(b <= a for a, b in pairwise(fractions)):
            raise ValueError(f"block_schedule fractions must increase, got {fractions}")
        if fractions[-1] >= self.bc_end:
            raise ValueError(
                f"every block-size transition must come before bc_end={self.bc_end}, got {fractions}"
            )
        sizes = [b for _, b in schedule]
        if self.transition_method == "exact" and any(a % b for a, b in pairwise(sizes)):
            raise ValueError(
                f"exact transitions need each block size to divide the previous one, got {sizes}"
            )
        return schedule

    def _check_compression_cap(self) -> None:
        """Raise when a block size alone compresses a layer beyond ``max_sparsity`` (target ``"compression"``)."""
        cap = self.sparsity.max_sparsity
        over = [
            b for _, b in self.block_schedule if self.target == "compression" and 1.0 - 1.0 / b > cap + 1e-12
        ]
        if over:
            raise ValueError(
                f"block size {over[0]} compresses a layer by {1 - 1 / over[0]:.1%} before any pruning, above "
                f"max_sparsity={cap:g}: the cap bounds each layer's compression in every phase (target="
                f"'compression'); use block sizes of at most {int(1 / (1 - cap) + 1e-9)}"
                f" or a max_sparsity of at least {1 - 1 / over[0]:g}"
            )

    def step_of(self, fraction: float) -> int:
        """Return the step at ``fraction`` of training (of the updates from ``start_step`` to the end)."""
        return fraction_step(fraction, self.total_steps, self.start_step)


@dataclass
class GSTAction:
    """One change :class:`GSTSchedule` asks for at a step."""

    step: int
    kind: str
    """``"block_circulant"``, ``"transition"``, ``"hand_over"`` or ``"prune"``."""
    block_size: int | None = None
    """New block size (block_circulant, transition) or the block size handed over (hand_over)."""
    sparsity: float | None = None
    """The target after the action (prune, hand_over): each layer's compression (``target="compression"``)
    or its stored values' sparsity (``"stored"``); dense weights after the hand-over either way."""
    method: str | None = None
    """Transition method, or hand-over kind."""


@dataclass
class GSTHooks:
    """What a caller of :meth:`GSTSchedule.execute_` adds to an action; every hook is optional.

    The schedule knows one module; a training framework knows more: layers outside the compression that
    must keep the compressed layers' structure (an RL target network), optimizers it manages itself,
    where it logs. Hooks are called in this order during one action: ``mirror_layer``/``mirror_chain``
    right after each layer or chain changes structure, ``after_prune`` after a pruning (also the
    hand-over's), ``after_structure_change`` after every kind but ``prune``, ``after_action`` last.
    """

    mirror_layer: Callable[[str, Callable[[nn.Module], object]], None] | None = None
    """``mirror_layer(name, transform)``: apply ``transform`` (what the eligible layer ``name`` just went
    through: made block-circulant) to the layers that must keep its structure."""
    mirror_chain: Callable[[str, Callable[[list[nn.Module]], object]], None] | None = None
    """``mirror_chain(chain, transform)``: the same for a chain of ``chains`` split by an exact transition
    (``transform`` takes the twin chain's layers in forward order)."""
    after_prune: Callable[[dict[str, torch.Tensor]], None] | None = None
    """``after_prune(previous)``: called after the eligible layers were pruned, with their masks from
    before (by layer name; layers that had none are left out)."""
    after_structure_change: Callable[[list[torch.Tensor]], None] | None = None
    """``after_structure_change(changed)``: called after a structural change (block-circulant on, a
    transition, the hand-over), once the ``optimizers`` given to ``execute_`` had the state of ``changed``
    (the module's parameters whose state is stale, see ``GSTConfig.optimizer_reset``) dropped."""
    after_action: Callable[[GSTAction, CompressionReport], None] | None = None
    """``after_action(action, report)``: called once the action is carried out (e.g. to record it)."""
