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
  the :class:`RewardAwareSparsity` target is updated on the scores (episode returns) that finished so far
  and applied by magnitude pruning to the eligible layers. S_shift = 1 starts pruning exactly at the
  hand-over; S_shift = 0.25 starts it a quarter of the way into the block-circulant phase, so the vectors
  are already sparse when the hand-over comes (paper values: 0.25 and 1.0).
- What the target means (``target``). ``"compression"`` (default): the target is each layer's compression,
  the fraction of its dense weights it does not store, in every phase, so ``max_sparsity`` caps the
  compression and it never rises above it. A block-circulant layer with block size B already stores
  ``1/B`` (a block size with ``1 - 1/B > max_sparsity`` is refused by :class:`GSTConfig`); it reaches a
  target ``c > 1 - 1/B`` by pruning ``1 - B (1 - c)`` of its B-vector entries, and the target starts from
  ``1 - 1/B`` when pruning begins in the block-circulant phase. ``"stored"``: the
  target is the sparsity of the stored values (the B-vectors while block-circulant), the rule of earlier
  rlq versions, kept for ablations: at 0.9 and B = 4 a layer then stores 2.5% of its weights, more
  compression than the cap, given back at the hand-over.
- ``bc_end * T`` (the hand-over, skipped when ``bc_end == 1``): the block-circulant structure is removed
  and the weights continue as pruned dense weights. ``handover="keep_ratio"`` (default) keeps the stored
  count: with vector sparsity ``s`` the expanded weights are magnitude-pruned to ``c = 1 - (1 - s) / B``
  (capped at the maximum sparsity) and the target continues from ``c``, so the compression ratio does not
  drop. ``handover="exact"`` keeps the function: the vector mask is expanded (sparsity stays ``s``), so
  the compression ratio falls from ``1 - (1 - s) / B`` to ``s``; a small S_shift makes that fall small.

Block pruning (``prune_block=(R, K)``, our design): every pruning above masks whole blocks, chosen by their
L2 norm (:func:`rlq.compress.magnitude_prune_` with ``block``). While block-circulant, a layer loses whole
B-vectors (each one ``B x B`` block of the expanded weight), so the target counts vectors as it counted
vector entries; after the hand-over its dense weight loses whole ``R x K`` blocks. ``keep_ratio`` re-prunes
the expanded weight in ``R x K`` blocks at the hand-over; ``exact`` keeps the expanded vector mask (zeros in
``B x B`` blocks) until the next pruning update re-chooses the mask in ``R x K`` blocks. The reward-aware
target and its back-off act as without blocks: a lower target regrows the blocks of largest norm.

Two more choices of ours, each a knob so that an ablation can switch it back:

- ``bc_init="scaled"``: at GST's start the projected B-vectors are rescaled so that each layer keeps the
  Frobenius norm of its dense initialisation (about ``sqrt(B)`` times the projection). The nearest
  block-circulant matrix averages each cyclic diagonal, which is right for a trained weight but shrinks a
  freshly initialised one (B i.i.d. entries averaged: std / sqrt(B)); scaled, the weight keeps the entry
  std (and, for PyTorch's i.i.d. default init, the spectral norm) of the initialisation the algorithm's
  hyperparameters were tuned for (:data:`rlq.compress.block_circulant.INITS`). ``"projection"`` keeps the
  plain projection.
- ``optimizer_reset="changed"``: after a structural change only the optimizer state of parameters whose
  shape or values the change touched (the re-structured weights, permuted biases and neighbours) is
  dropped; the dense first and last layers, untouched biases and other networks keep their moments.
  ``"all"`` drops every parameter's state.

One execution path. :meth:`GSTSchedule.step` only decides (it updates the reward controller, never a
module) and returns the actions due; :meth:`GSTSchedule.execute_` carries out one action on a module and
is the one place that says what each action kind does. It acts either on the layers the config finds
(``skip_first_last`` and ``networks``) or on layers and chains the caller names, and calls the optional
:class:`GSTHooks` for what only the caller knows (twin layers that must keep the same structure, optimizer
state, logging). Neither knows about any RL library:

- a plain training loop (:func:`rlq.vision.training.train_classifier`) calls
  ``apply_(model, step, scores, optimizers)``: ``step`` then ``execute_`` with default hooks, which reset
  the state ``optimizers`` hold for the module after every structural change;
- :class:`rlq.sb3.gst_callback.GSTCallback` calls ``step``, then ``execute_`` with the SB3 policy's eligible layers
  and chains (:func:`rlq.sb3.networks.policy_layers`) and hooks that mirror the target networks, reset and
  park the optimizers' state and record its events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from functools import partial
from typing import Any

import torch
from torch import nn

from rlq.compress.block_circulant import (
    block_circulant_,
    block_size_of,
    is_block_circulant,
    make_block_circulant_,
    remove_block_circulant_,
    stored_target,
)
from rlq.compress.gst_config import (
    BC_INITS,
    HANDOVERS,
    OPTIMIZER_RESETS,
    TARGETS,
    TRANSITION_METHODS,
    GSTAction,
    GSTConfig,
    GSTHooks,
    fraction_step,
)
from rlq.compress.layers import CompressionReport, covered_fraction_of, eligible_layers
from rlq.compress.masks import mask_of
from rlq.compress.optimizer_state import reset_optimizer_state_
from rlq.compress.pruning import magnitude_prune_
from rlq.compress.reward_aware import RewardAwareSparsity
from rlq.compress.transitions import (
    record_shifts,
    split_blocks_exact_,
    transition_exact_,
    transition_projection_,
)

__all__ = [
    "BC_INITS",
    "HANDOVERS",
    "OPTIMIZER_RESETS",
    "TARGETS",
    "TRANSITION_METHODS",
    "GSTAction",
    "GSTConfig",
    "GSTHooks",
    "GSTSchedule",
    "fraction_step",
    "replay_decisions",
]


def _call(hook: Callable[..., None] | None, *args: Any) -> None:
    if hook is not None:
        hook(*args)


def _split_chains_exact_(
    module: nn.Module,
    chains: Mapping[str, Sequence[str]],
    block_size: int,
    mirror_chain: Callable[[str, Callable[[list[nn.Module]], object]], None] | None = None,
) -> CompressionReport:
    """Return a report after splitting each named chain's block-circulant layers to ``block_size`` exactly.

    :func:`rlq.compress.split_blocks_exact_` on each chain given as layer names in forward order (the caller
    vouches that each is a plain chain, as for a list of layers there); ``mirror_chain`` gets each split.
    """
    report = CompressionReport()
    for chain_name, names in chains.items():
        chain = [module.get_submodule(name) for name in names]
        sizes = {block_size_of(layer) for layer in chain} - {None}
        if not sizes:
            continue
        if len(sizes) > 1:
            raise ValueError(
                f"chain {chain_name!r} holds block sizes {sorted(sizes)}; the exact split needs one"
            )
        (size,) = sizes
        if size == block_size:
            continue
        if size % block_size:
            raise ValueError(f"new block size {block_size} does not divide the current block size {size}")
        shifts = split_blocks_exact_(chain, size // block_size)
        _call(mirror_chain, chain_name, partial(split_blocks_exact_, factor=size // block_size))
        record_shifts(report, names, shifts)
    report.covered_fraction = covered_fraction_of(module, report.compressed)
    return report


class GSTSchedule:
    """Decide and apply GST's compression actions over training (OUR DESIGN of the unpublished parts).

    The timeline, S_shift's meaning and the hand-over are described in :mod:`rlq.compress.gst`; every knob
    is a field of :class:`GSTConfig`. Call :meth:`apply_` once per training step (or at any increasing
    steps: actions whose time has passed are all carried out at the next call), or :meth:`step` and then
    :meth:`execute_` for each action returned, with :class:`GSTHooks` and the layers to act on.
    """

    def __init__(self, config: GSTConfig):
        self.config = config
        self.controller = RewardAwareSparsity(config.sparsity)
        self.started = False
        self.transitions_done = 0
        self.handed_over = False
        self.last_step: int | None = None
        self.last_prune_step: int | None = None
        self.last_observe_step: int | None = None
        self.applied_sparsity = 0.0
        """The target last applied (see :attr:`GSTAction.sparsity`)."""
        self.last_reports: dict[str, CompressionReport] = {}
        """The report of the last action of each kind carried out by :meth:`execute_`."""

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

    def stored_sparsity(self, target: float, block_size: int | None) -> float:
        """Return the sparsity of a layer's stored values that meets ``target`` (B-vectors when ``block_size``).

        With ``target="compression"`` a block-circulant layer prunes ``max(0, 1 - B (1 - target))`` of its
        vector entries, so it stores ``1 - target`` of its dense weights (or ``1/B`` if that is less).
        """
        if block_size is None or self.config.target == "stored":
            return target
        return max(0.0, 1.0 - block_size * (1.0 - target))

    def step(self, step: int, scores: Iterable[float] = ()) -> list[GSTAction]:
        """Return the actions due at ``step`` (updating the reward-aware target); changes no module.

        ``scores`` are the scores that finished since the last call, oldest first: episode returns in RL
        (leave out a random warm-up's, see :meth:`counts_episode`), a validation accuracy per epoch in
        classification. The controller decides on them once per pruning update.
        """
        if self.last_step is not None and step < self.last_step:
            raise ValueError(f"steps must not go back: got {step} after {self.last_step}")
        self.last_step = step
        self.controller.add_scores(scores)
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
            if config.target == "compression" and self.applied_sparsity > 0:
                # the new block size stores more: prune its vectors back to the target now
                actions.append(GSTAction(step, "prune", sparsity=self.applied_sparsity))
        handover = self.handover_step
        if not self.handed_over and handover is not None and step >= handover:
            self.handed_over = True
            size = config.block_schedule[-1][1]
            vectors = self.stored_sparsity(self.applied_sparsity, size)
            # keep_ratio: the dense weights store what the vectors stored; exact: the vector mask expanded
            s = 1.0 - (1.0 - vectors) / size if config.handover == "keep_ratio" else vectors
            s = self.applied_sparsity = self.controller.reset_target(s)
            actions.append(GSTAction(step, "hand_over", block_size=size, sparsity=s, method=config.handover))
        if step < self.rise_step and (
            self.last_observe_step is None or step - self.last_observe_step >= config.prune_every
        ):  # before pruning: the reward trend the controller's trend guard compares with (our design)
            self.last_observe_step = step
            self.controller.observe()
        if step >= self.rise_step and (
            self.last_prune_step is None or step - self.last_prune_step >= config.prune_every
        ):
            self.last_prune_step = step
            size = self.block_size_at(step)
            if self.controller.updates == 0 and config.target == "compression" and size is not None:
                # pruning begins in the block-circulant phase: the layers already store 1/B
                self.controller.reset_target(max(self.controller.target, 1.0 - 1.0 / size))
            target = self.controller.update()
            if target != self.applied_sparsity:
                self.applied_sparsity = target
                actions.append(GSTAction(step, "prune", sparsity=target))
        return actions

    def counts_episode(self, end_step: int, length: int) -> bool:
        """Return whether an episode that ended at ``end_step`` after ``length`` steps is a score to judge by.

        The episodes rule leaves out episodes that began before ``start_step`` (an off-policy algorithm's
        random warm-up, a policy no pruning decision should be compared with); the windowed rule of earlier
        rlq versions counted every episode.
        """
        return self.config.sparsity.rule == "windowed" or end_step - length >= self.config.start_step

    def apply_(
        self,
        module: nn.Module,
        step: int,
        scores: Iterable[float] = (),
        optimizers: Sequence[torch.optim.Optimizer] = (),
        *,
        layers: Sequence[str] | None = None,
        chains: Mapping[str, Sequence[str]] | None = None,
        hooks: GSTHooks | None = None,
    ) -> list[GSTAction]:
        """Return the actions due at ``step`` after carrying each out on ``module`` with :meth:`execute_`."""
        actions = self.step(step, scores)
        for action in actions:
            self.execute_(module, action, optimizers, layers=layers, chains=chains, hooks=hooks)
        return actions

    def execute_(
        self,
        module: nn.Module,
        action: GSTAction,
        optimizers: Sequence[torch.optim.Optimizer] = (),
        *,
        layers: Sequence[str] | None = None,
        chains: Mapping[str, Sequence[str]] | None = None,
        hooks: GSTHooks | None = None,
    ) -> CompressionReport:
        """Return the report of carrying out one ``action`` on ``module`` in place.

        - ``block_circulant``: the eligible layers become block-circulant (B-vectors projected, then scaled
          back to each layer's Frobenius norm with ``bc_init="scaled"``).
        - ``transition``: every block-circulant layer changes its block size; ``"exact"`` splits each chain
          (each network of ``config.networks``, checked to be one ``nn.Sequential``, or each of ``chains``),
          ``"projection"`` re-projects each layer.
        - ``hand_over``: every block-circulant layer becomes dense (its vector mask expanded); with
          ``"keep_ratio"`` the eligible layers are then pruned to the action's sparsity. The report lists
          the layers handed over.
        - ``prune``: the eligible layers' stored values are magnitude-pruned to meet the action's target
          (:meth:`stored_sparsity` per layer).

        Eligible layers are ``layers`` (qualified names) when given, else those of
        :func:`rlq.compress.eligible_layers` with ``config.skip_first_last`` and ``config.networks``; given
        layers that are block-circulant already stay as they are. Transitions and the hand-over act on every
        block-circulant layer of ``module``. After a structural change (every kind but ``prune``) the state
        ``optimizers`` hold for the module's changed parameters (``config.optimizer_reset``) is reset.
        """
        hooks = hooks or GSTHooks()
        where = self._where(layers)
        before = None if action.kind == "prune" else _snapshot(module)
        if action.kind == "block_circulant":
            report = self._block_circulant_(module, action.block_size, layers, hooks)
        elif action.kind == "transition":
            report = self._transition_(module, action, chains, hooks)
        elif action.kind == "hand_over":
            report = self._hand_over_(module, action, where, hooks)
        elif action.kind == "prune":
            report = self._prune_(module, action.sparsity, where, hooks)
        else:
            raise ValueError(f"unknown action kind {action.kind!r}")
        if before is not None:
            changed = (
                list(module.parameters())
                if self.config.optimizer_reset == "all"
                else _changed_parameters(module, before)
            )
            for optimizer in optimizers:
                reset_optimizer_state_(optimizer, changed)
            _call(hooks.after_structure_change, changed)
        self.last_reports[action.kind] = report
        _call(hooks.after_action, action, report)
        return report

    def _where(self, layers: Sequence[str] | None) -> dict[str, Any]:
        """Return the eligibility keywords of the rlq.compress transforms: ``layers``, else the config's."""
        if layers is None:
            return dict(skip_first_last=self.config.skip_first_last, networks=self.config.networks)
        return dict(skip_first_last=False, networks=[[name] for name in layers])

    def _how(self) -> dict[str, Any]:
        """Return the pruning keywords of the config: ``scope``, and ``block`` when it prunes in blocks."""
        how: dict[str, Any] = {"scope": self.config.scope}
        if self.config.prune_block is not None:
            how["block"] = self.config.prune_block
        return how

    def _block_circulant_(
        self, module: nn.Module, block_size: int, layers: Sequence[str] | None, hooks: GSTHooks
    ) -> CompressionReport:
        if layers is not None:  # a run resumed into a fresh schedule: what is block-circulant stays so
            layers = [name for name in layers if not is_block_circulant(module.get_submodule(name))]
        init = self.config.bc_init
        report = block_circulant_(module, block_size, init=init, **self._where(layers))
        if hooks.mirror_layer is not None:
            for name in report.compressed:
                hooks.mirror_layer(name, partial(make_block_circulant_, block_size=block_size, init=init))
        return report

    def _transition_(
        self,
        module: nn.Module,
        action: GSTAction,
        chains: Mapping[str, Sequence[str]] | None,
        hooks: GSTHooks,
    ) -> CompressionReport:
        if action.method == "projection":
            return transition_projection_(module, action.block_size)
        if chains is None:
            return transition_exact_(module, action.block_size, networks=self.config.networks)
        return _split_chains_exact_(module, chains, action.block_size, hooks.mirror_chain)

    def _hand_over_(
        self, module: nn.Module, action: GSTAction, where: dict[str, Any], hooks: GSTHooks
    ) -> CompressionReport:
        removed = remove_block_circulant_(module, keep_pruning=True)
        report = CompressionReport(compressed=removed, covered_fraction=covered_fraction_of(module, removed))
        if action.method == "keep_ratio" and action.sparsity > 0:
            report.dense = self._prune_(module, action.sparsity, where, hooks).dense
        return report

    def _prune_(
        self, module: nn.Module, target: float, where: dict[str, Any], hooks: GSTHooks
    ) -> CompressionReport:
        named = eligible_layers(module, **where)
        previous = None
        if hooks.after_prune is not None:
            previous = {
                name: mask.clone()
                for name, layer in named
                if (mask := mask_of(*stored_target(layer))) is not None
            }
        groups: dict[float, list[str]] = {}  # layers by the stored sparsity that meets the target
        for name, layer in named:
            groups.setdefault(self.stored_sparsity(target, block_size_of(layer)), []).append(name)
        if len(groups) <= 1:
            report = magnitude_prune_(module, next(iter(groups), target), **self._how(), **where)
        else:
            report = CompressionReport()
            for sparsity, names in groups.items():
                part = magnitude_prune_(module, sparsity, **self._how(), **self._where(names))
                report.compressed += part.compressed
            report.covered_fraction = covered_fraction_of(module, report.compressed)
        _call(hooks.after_prune, previous)
        return report

    def state_dict(self) -> dict[str, Any]:
        """Return the schedule's progress and controller state as plain Python values, to resume a run."""
        return {
            "started": self.started,
            "transitions_done": self.transitions_done,
            "handed_over": self.handed_over,
            "last_step": self.last_step,
            "last_prune_step": self.last_prune_step,
            "last_observe_step": self.last_observe_step,
            "applied_sparsity": self.applied_sparsity,
            "controller": self.controller.state_dict(),
            "config": {k: v for k, v in asdict(self.config).items() if k != "sparsity"},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the progress saved by :meth:`state_dict` (the module's compression is in its weights)."""
        for key in ("started", "transitions_done", "handed_over", "last_step", "last_prune_step"):
            setattr(self, key, state[key])
        self.last_observe_step = state["last_observe_step"]
        self.applied_sparsity = float(state["applied_sparsity"])
        self.controller.load_state_dict(state["controller"])


def _snapshot(module: nn.Module) -> dict[int, torch.Tensor]:
    """Return a copy of every parameter of ``module`` by identity (before a structural change)."""
    return {id(p): p.detach().clone() for p in module.parameters()}


def _changed_parameters(module: nn.Module, before: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    """Return the parameters of ``module`` that are new or whose shape or values differ from ``before``."""
    changed = []
    for p in module.parameters():
        old = before.get(id(p))
        if old is None or old.shape != p.shape or not torch.equal(old, p.detach()):
            changed.append(p)
    return changed


def replay_decisions(
    config: GSTConfig, episodes: Iterable[tuple[int, float, int]], end_step: int | None = None
) -> list[dict[str, Any]]:
    """Return one row per pruning update of a fresh schedule replayed on a logged stream of episodes.

    ``episodes`` are ``(end_step, return, length)`` in the order they finished (a run's ``curve.csv``);
    each reaches the schedule at its end step, filtered by :meth:`GSTSchedule.counts_episode`, as
    :class:`rlq.sb3.gst_callback.GSTCallback` feeds them. Nothing is trained, so the rows say what the schedule
    would have decided on those returns: ``step``, ``decision``, ``target``, ``applied`` and the ``actions``
    due (kinds joined by ``+``), up to ``end_step`` (default ``config.total_steps``).
    """
    schedule = GSTSchedule(config)
    by_step: dict[int, list[tuple[float, int]]] = {}
    for step, value, length in episodes:
        by_step.setdefault(int(step), []).append((float(value), int(length)))
    rows = []
    for step in range(0, (config.total_steps if end_step is None else end_step) + 1):
        finished = by_step.get(step, ())
        updates = schedule.controller.updates, schedule.last_prune_step
        actions = schedule.step(step, [r for r, n in finished if schedule.counts_episode(step, n)])
        if (schedule.controller.updates, schedule.last_prune_step) != updates or actions:
            rows.append(
                {
                    "step": step,
                    "decision": schedule.controller.last_decision,
                    "target": schedule.controller.target,
                    "applied": schedule.applied_sparsity,
                    "actions": "+".join(a.kind for a in actions),
                }
            )
    return rows
