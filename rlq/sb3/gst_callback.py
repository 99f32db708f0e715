"""GST during Stable-Baselines3 training: :class:`GSTCallback` (block-circulant from step 0, then
reward-aware magnitude pruning), on any SB3 algorithm.

Paper: Lee et al., arXiv 2101.09650. The schedule is :class:`rlq.compress.GSTSchedule` (OUR DESIGN where
the paper is silent); it decides every action and carries it out (``step``, then ``execute_``). This
callback gives it what only SB3 knows: the policy's eligible layers and chains
(:func:`rlq.sb3.networks.policy_layers`) and :class:`rlq.compress.gst.GSTHooks` that mirror the target
networks, reset and park the optimizers' state and record the events. What every compression callback
shares (layers, targets, optimizer state, history, checkpoints) is
:class:`rlq.sb3.compression.CompressionCallback`.

    from rlq.sb3.gst_callback import GSTCallback
    gst = GSTCallback(block_schedule=((0.0, 4), (0.25, 2)), s_shift=0.25, bc_end=0.5, prune_every=1000)
    model.learn(100_000, callback=gst)
    gst.history                      # one row per action and every ``log_every`` steps
    gst.average_compression_ratio()  # GST's headline measure

Sparse and low-bit at once: add :class:`rlq.sb3.qat_callback.QATCallback` to the same ``learn`` (either order);
QAT then quantizes the stored B-vectors and kept weights (see :mod:`rlq.sb3.qat_stacking`). Without QAT nothing
here changes.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, fields
from typing import Any

from rlq.compress import CompressionReport, GSTAction, GSTConfig, GSTSchedule, RewardAwareConfig
from rlq.compress.gst import GSTHooks
from rlq.core.jsonio import json_safe
from rlq.sb3.compression import CompressionCallback
from rlq.sb3.networks import check_exact_transitions


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
      step_size, backoff, rule, window, min_episodes, tolerance, abs_tolerance, ...); the controller reads
      every finished episode's return.
    - ``target``, ``bc_init``, ``optimizer_reset``: what the target means, the B-vectors at the start and
      which optimizer state a structural change drops (defaults: ``"compression"``, ``"scaled"``,
      ``"changed"``; the other values are the ablation's settings without its fixes).
    - ``skip_first_last``, ``scope``: which layers, and per-layer or global magnitude ranking.
    - ``prune_block``: ``(rows, inputs)`` to prune whole blocks by their L2 norm (B-vectors whole while
      block-circulant; rlq's design), e.g. ``rlq.compress.pruning.DEPLOY_BLOCK = (16, 4)``, the shape
      ``rlq.deploy``'s block-sparse kernel reads best (the reason is in its docstring), so that the final
      actor compiles block-sparse; None (default): single weights by magnitude.

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
        schedule = self.schedule
        updates = schedule.controller.updates, schedule.last_prune_step
        actions = schedule.step(self.num_timesteps, self._scores())
        if actions:
            layers, hooks = self._require_layers(), self._gst_hooks()
            with self._changing_structure():
                for action in actions:
                    schedule.execute_(
                        self.model.policy, action, layers=layers.eligible, chains=layers.chains, hooks=hooks
                    )
            self._log("+".join(a.kind for a in actions))
        elif (schedule.controller.updates, schedule.last_prune_step) != updates:
            self._log("hold")  # the target was updated and did not change: show the pause in the history
        return bool(actions) or self._last_log == self.num_timesteps

    def _scores(self) -> list[float]:
        """Return the returns of the episodes that finished at this step and count for the controller."""
        step = self.num_timesteps
        return [r for r, length in self._finished if self.schedule.counts_episode(step, length)]

    def _gst_hooks(self) -> GSTHooks:
        """Return what the schedule cannot know of an SB3 policy: its targets, optimizers and event table."""
        return GSTHooks(
            mirror_layer=self._mirror_layer_,
            mirror_chain=self._mirror_chain_,
            after_prune=self._after_prune_,
            after_structure_change=self._after_structure_change_,
            after_action=self._record_action,
        )

    def _record_action(self, action: GSTAction, report: CompressionReport) -> None:
        """Add an event row: the online layers the action compressed, their mean shift, the action's fields."""
        online = self._require_layers().online
        names = [name for name in report.compressed if name in online]
        shifts = [report.shift[name] for name in names if name in report.shift]
        self._record_event(
            action.kind,
            names,
            shifts,
            block_size=action.block_size,
            sparsity=action.sparsity,
            method=action.method,
        )

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
        if (
            saved is not None
            and self.config is not None
            and not _same_config(saved, _config_dict(self.config))
        ):
            raise ValueError(
                "the saved GST state was made with another configuration; resume with the same settings.\n"
                f"saved:   {saved}\ncurrent: {_config_dict(self.config)}"
            )
        if state.get("schedule") is not None:
            self.schedule.load_state_dict(state["schedule"])


def _config_dict(config: GSTConfig) -> dict[str, Any]:
    return json.loads(json.dumps(json_safe(asdict(config))))


def _defaults() -> dict[str, Any]:
    """Return the JSON form of every GSTConfig (and nested RewardAwareConfig) field that has a default."""
    reward = {f.name: f.default for f in fields(RewardAwareConfig) if f.default is not MISSING}
    top = {f.name: f.default for f in fields(GSTConfig) if f.default is not MISSING}
    return json.loads(json.dumps(json_safe(top | {"sparsity": reward})))


def _same_config(saved: dict[str, Any], current: dict[str, Any]) -> bool:
    """Return whether a saved config matches ``current``, a field the save predates counting as its default.

    A state saved before a setting existed (the trend guard's ``trend_ratio``, ``trend_window``) resumes when
    that setting is at its default, which reproduces the behaviour it was saved under.
    """
    defaults = _defaults()

    def same(old: dict[str, Any], new: dict[str, Any], default: dict[str, Any]) -> bool:
        for key in old.keys() | new.keys():
            if key not in new:
                return False
            if key not in old:
                if key not in default or default[key] != new[key]:
                    return False
            elif isinstance(old[key], dict) and isinstance(new[key], dict):
                if not same(old[key], new[key], default.get(key, {})):
                    return False
            elif old[key] != new[key]:
                return False
        return True

    return same(saved, current, defaults)
