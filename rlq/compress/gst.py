"""GST's training schedule: block-circulant from step 0, optional block-size transitions, then pruning.

Group-Sparse Training (Lee et al., arXiv 2101.09650, https://arxiv.org/abs/2101.09650) publishes the shape
of the schedule but not its exact rules; the timing below (the meaning of S_shift, the hand-over, the
reward-aware target) is OUR DESIGN, chosen to show the behaviour the paper describes.

Timeline, with ``T = total_steps`` and fractions of training measured over the training updates
``[start_step, T)`` (``start_step``: an off-policy algorithm's ``learning_starts``, before which nothing is
trained; 0 on-policy), so "25% of training" means a quarter of the updates:

- step 0: every eligible layer becomes block-circulant with the first block size of ``block_schedule``.
- at ``fraction * T`` for each later ``(fraction, B)`` of ``block_schedule``: a block-size transition by
  ``transition_method`` (``"exact"``: zero parameter shift, hidden units reordered; ``"projection"``).
- ``rise = s_shift * bc_end * T`` (S_shift, our meaning): from this step on, every ``prune_every`` steps
  the :class:`RewardAwareSparsity` target is updated with the latest reward and applied by magnitude
  pruning to the eligible layers. While the layers are still block-circulant the target is the sparsity
  of their B-vector entries (compression ``1 - (1 - s) / B``), afterwards of their dense weights.
  S_shift = 1 starts pruning exactly at the hand-over; S_shift = 0.25 starts it a quarter of the way into
  the block-circulant phase, so the vectors are already sparse when the hand-over comes (paper values:
  0.25 and 1.0).
- ``bc_end * T`` (the hand-over, skipped when ``bc_end == 1``): the block-circulant structure is removed
  and the weights continue as pruned dense weights. ``handover="keep_ratio"`` (default) keeps the stored
  count: the expanded weights are magnitude-pruned to ``c = 1 - (1 - s) / B`` (capped at the maximum
  sparsity) and the target continues from ``c``, so the compression ratio does not drop.
  ``handover="exact"`` keeps the function: the vector mask is expanded (sparsity stays ``s``), so the
  compression ratio falls from ``1 - (1 - s) / B`` to ``s``; a small S_shift makes that fall small.

:meth:`GSTSchedule.step` only decides (it updates the reward controller, never a module) and returns
the actions due; :meth:`GSTSchedule.apply_` also carries them out on a module. Neither knows about any RL
library: an SB3 callback calls ``apply_(policy, num_timesteps, reward, optimizers)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

import torch
from torch import nn

from rlq.compress.block_circulant import block_circulant_, remove_block_circulant_
from rlq.compress.circulant import check_block_size
from rlq.compress.layers import CompressionReport, Networks
from rlq.compress.optimizer_state import reset_optimizer_state_
from rlq.compress.pruning import SCOPES, magnitude_prune_
from rlq.compress.reward_aware import RewardAwareConfig, RewardAwareSparsity
from rlq.compress.transitions import transition_exact_, transition_projection_
from rlq.core.validation import check_positive_int

TRANSITION_METHODS = ("exact", "projection")
HANDOVERS = ("keep_ratio", "exact")


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
        schedule = tuple((float(f), check_block_size(b)) for f, b in self.block_schedule)
        if not schedule or schedule[0][0] != 0.0:
            raise ValueError(f"block_schedule must start with (0.0, B), got {self.block_schedule!r}")
        fractions = [f for f, _ in schedule]
        if any(b <= a for a, b in pairwise(fractions)):
            raise ValueError(f"block_schedule fractions must increase, got {fractions}")
        if not 0.0 < self.bc_end <= 1.0:
            raise ValueError(f"bc_end must be in (0, 1], got {self.bc_end}")
        if fractions[-1] >= self.bc_end:
            raise ValueError(
                f"every block-size transition must come before bc_end={self.bc_end}, got {fractions}"
            )
        sizes = [b for _, b in schedule]
        if self.transition_method not in TRANSITION_METHODS:
            raise ValueError(
                f"transition_method must be one of {TRANSITION_METHODS}, got {self.transition_method!r}"
            )
        if self.transition_method == "exact" and any(a % b for a, b in pairwise(sizes)):
            raise ValueError(
                f"exact transitions need each block size to divide the previous one, got {sizes}"
            )
        if not 0.0 <= self.s_shift <= 1.0:
            raise ValueError(f"s_shift must be in [0, 1], got {self.s_shift}")
        check_positive_int("prune_every", self.prune_every)
        if self.handover not in HANDOVERS:
            raise ValueError(f"handover must be one of {HANDOVERS}, got {self.handover!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {self.scope!r}")
        self.block_schedule = schedule

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
    """Target sparsity of the stored values after the action (prune, hand_over)."""
    method: str | None = None
    """Transition method, or hand-over kind."""


class GSTSchedule:
    """Decide and apply GST's compression actions over training (OUR DESIGN of the unpublished parts).

    The timeline, S_shift's meaning and the hand-over are described in :mod:`rlq.compress.gst`; every knob
    is a field of :class:`GSTConfig`. Call :meth:`apply_` once per training step (or at any increasing
    steps: actions whose time has passed are all carried out at the next call).
    """

    def __init__(self, config: GSTConfig):
        self.config = config
        self.controller = RewardAwareSparsity(config.sparsity)
        self.started = False
        self.transitions_done = 0
        self.handed_over = False
        self.last_step: int | None = None
        self.last_prune_step: int | None = None
        self.applied_sparsity = 0.0
        self.latest_reward: float | None = None
        self.last_reports: dict[str, CompressionReport] = {}
        """The report of the last action of each kind carried out by :meth:`apply_`."""

    @property
    def rise_step(self) -> int:
        """Return the step at which the pruning target starts to rise (``s_shift * bc_end * T``)."""
        return self.config.step_of(self.config.s_shift * self.config.bc_end)

    @property
    def handover_step(self) -> int | None:
        """Return the step of the hand-over from block-circulant to pruned weights (None: never)."""
        return None if self.config.bc_end >= 1.0 else self.config.step_of(self.config.bc_end)

    def block_size_at(self, step: int) -> int | None:
        """Return the block size the schedule prescribes at ``step`` (None after the hand-over)."""
        handover = self.handover_step
        if handover is not None and step >= handover:
            return None
        schedule = self.config.block_schedule  # the first block size holds from step 0, before any update
        return ([schedule[0][1]] + [b for f, b in schedule[1:] if self.config.step_of(f) <= step])[-1]

    def phase(self, step: int) -> str:
        """Return ``"block_circulant"``, ``"block_circulant+pruning"`` or ``"pruning"`` at ``step``."""
        if self.block_size_at(step) is None:
            return "pruning"
        return "block_circulant+pruning" if step >= self.rise_step else "block_circulant"

    def step(self, step: int, reward: float | None = None) -> list[GSTAction]:
        """Return the actions due at ``step`` (updating the reward-aware target); changes no module.

        ``reward`` is the latest training reward (e.g. mean return of recent episodes) or None; the
        controller sees the latest reward once per pruning update.
        """
        if self.last_step is not None and step < self.last_step:
            raise ValueError(f"steps must not go back: got {step} after {self.last_step}")
        self.last_step = step
        if reward is not None:
            self.latest_reward = float(reward)
        config = self.config
        actions: list[GSTAction] = []
        if not self.started:
            self.started = True
            actions.append(GSTAction(step, "block_circulant", block_size=config.block_schedule[0][1]))
        transitions = config.block_schedule[1:]
        while self.transitions_done < len(transitions) and step >= config.step_of(
            transitions[self.transitions_done][0]
        ):
            size = transitions[self.transitions_done][1]
            actions.append(GSTAction(step, "transition", block_size=size, method=config.transition_method))
            self.transitions_done += 1
        handover = self.handover_step
        if not self.handed_over and handover is not None and step >= handover:
            self.handed_over = True
            size = config.block_schedule[-1][1]
            s = self.applied_sparsity  # of the B-vectors; an exact hand-over keeps it for the dense weights
            if config.handover == "keep_ratio":
                s = self.controller.reset_target(1.0 - (1.0 - s) / size)
            self.applied_sparsity = s
            actions.append(GSTAction(step, "hand_over", block_size=size, sparsity=s, method=config.handover))
        if step >= self.rise_step and (
            self.last_prune_step is None or step - self.last_prune_step >= config.prune_every
        ):
            self.last_prune_step = step
            target = self.controller.update(self.latest_reward)
            if target != self.applied_sparsity:
                self.applied_sparsity = target
                actions.append(GSTAction(step, "prune", sparsity=target))
        return actions

    def apply_(
        self,
        module: nn.Module,
        step: int,
        reward: float | None = None,
        optimizers: Sequence[torch.optim.Optimizer] = (),
    ) -> list[GSTAction]:
        """Return the actions due at ``step`` after carrying them out on ``module`` in place.

        After a structural change (block-circulant on, a transition, the hand-over) the state of
        ``optimizers`` for the module's parameters is reset (the tensors changed shape or order).
        """
        actions = self.step(step, reward)
        for action in actions:
            self.execute_(module, action, optimizers)
        return actions

    def execute_(
        self, module: nn.Module, action: GSTAction, optimizers: Sequence[torch.optim.Optimizer] = ()
    ) -> CompressionReport:
        """Return the report of carrying out one ``action`` on ``module`` in place."""
        config = self.config
        where = dict(skip_first_last=config.skip_first_last, networks=config.networks)
        if action.kind == "block_circulant":
            report = block_circulant_(module, action.block_size, **where)
        elif action.kind == "transition":
            if action.method == "exact":
                report = transition_exact_(module, action.block_size, networks=config.networks)
            else:
                report = transition_projection_(module, action.block_size)
        elif action.kind == "hand_over":
            report = CompressionReport(compressed=remove_block_circulant_(module, keep_pruning=True))
            if action.method == "keep_ratio" and action.sparsity > 0:
                report = magnitude_prune_(module, action.sparsity, scope=config.scope, **where)
        elif action.kind == "prune":
            return self._record(
                action, magnitude_prune_(module, action.sparsity, scope=config.scope, **where)
            )
        else:
            raise ValueError(f"unknown action kind {action.kind!r}")
        for optimizer in optimizers:
            reset_optimizer_state_(optimizer, module.parameters())
        return self._record(action, report)

    def _record(self, action: GSTAction, report: CompressionReport) -> CompressionReport:
        self.last_reports[action.kind] = report
        return report

    def state_dict(self) -> dict[str, Any]:
        """Return the schedule's progress and controller state as plain Python values, to resume a run."""
        return {
            "started": self.started,
            "transitions_done": self.transitions_done,
            "handed_over": self.handed_over,
            "last_step": self.last_step,
            "last_prune_step": self.last_prune_step,
            "applied_sparsity": self.applied_sparsity,
            "latest_reward": self.latest_reward,
            "controller": self.controller.state_dict(),
            "config": {k: v for k, v in asdict(self.config).items() if k != "sparsity"},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the progress saved by :meth:`state_dict` (the module's compression is in its weights)."""
        for key in ("started", "transitions_done", "handed_over", "last_step", "last_prune_step"):
            setattr(self, key, state[key])
        self.applied_sparsity = float(state["applied_sparsity"])
        self.latest_reward = state["latest_reward"]
        self.controller.load_state_dict(state["controller"])
