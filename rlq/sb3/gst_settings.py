"""The settings of GST's and the pruning baseline's callbacks that every GST notebook derives from its parameters, and
the GST ablation's arms."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlq.compress import RewardAwareConfig
from rlq.core.validation import check_positive_int

PRUNING_START_FRACTION = 0.2
PRUNING_END_FRACTION = 0.8
"""The pruning baseline's window: Zhu & Gupta's schedule rises from 20% to 80% of the training updates (the usual
RL setting, and what the GST paper's iterative-pruning baseline is taken to be; ``/work/shared/papers/gst.md``)."""

MAX_BUFFER_SIZE = 1_000_000
"""TD3's replay buffer (TD3 paper: 1M); :func:`td3_hyperparams` never makes it larger than the run's steps."""


EARLIER_GST = {
    "target": "stored",
    "bc_init": "projection",
    "optimizer_reset": "all",
    "sparsity": {"rule": "windowed", "backoff": 0.0},
}
"""The GST settings without the four fixes (``gst_none``), each a design defect behind a reward loss: a target
on the B-vectors that over-compresses before the hand-over, a controller fed a windowed mean that cannot see
a drop at the timescale of its own changes (it never backed off: ``backoff`` 0), every optimizer state
dropped at each structural change, and a projection that shrinks the fresh initialisation by about sqrt(B)."""

FIXES = {
    "cap": {"target": "compression"},
    "controller": {"sparsity": {"rule": "episodes"}},
    "optimizer": {"optimizer_reset": "changed"},
    "init": {"bc_init": "scaled"},
}
"""Each fix of :data:`EARLIER_GST` by itself (the controller's takes the notebook's ``sparsity_backoff``)."""

ABLATION_ARMS = {"gst_none": {}} | {f"gst_only_{name}": fix for name, fix in FIXES.items()}
"""GST variants of the ablation, by method name: the earlier settings (``gst_none``), and each fix alone on
top of them (``gst_only_<fix>``); plain ``gst`` has every fix."""


# --------------------------------------------------------------------------------------------------------
# Settings: one rule for every GST notebook


def compression_settings(
    total_timesteps: int,
    *,
    prune_updates: int,
    sparsity: Mapping[str, Any],
    block_schedule: Sequence[Sequence[float]],
    bc_end: float,
    s_shift: float | None = None,
    transition_method: str | None = None,
    learning_starts: int = 0,
) -> dict[str, dict[str, Any]]:
    """Return ``{"gst": ..., "pruning": ...}``: the settings of :class:`GSTCallback` and :class:`GradualPruningCallback`.

    One rule for every GST notebook, from its parameters:

    - GST updates its reward-aware target every ``total_timesteps // prune_updates`` environment steps under
      the controller ``sparsity`` (the fields of :class:`rlq.compress.RewardAwareConfig` by name, as
      :class:`GSTCallback` takes them; ``max_sparsity`` is required): each layer's compression is capped at
      ``max_sparsity``, rises by ``step_size`` while the returns of the episodes after the last rise stay
      within ``tolerance`` (relative) or ``abs_tolerance`` (absolute) of the level before it, falls by
      ``backoff`` when they drop, and moves again only once ``min_episodes`` new episodes have finished;
      ``trend_ratio > 0`` adds the trend guard (our design). ``s_shift`` and ``transition_method`` are left
      out when None (a sweep sets them per run).
    - The pruning baseline reaches ``max_sparsity`` (the same final sparsity as GST's cap) over
      :data:`PRUNING_START_FRACTION` to :data:`PRUNING_END_FRACTION` of the training updates, that is of the
      ``total_timesteps - learning_starts`` steps after an off-policy algorithm's random warm-up (0 for
      on-policy PPO and A2C), in ``prune_updates`` updates.

    The two count their updates differently for off-policy runs: GST's interval counts the warm-up steps,
    the baseline's does not (so with TD3, GST makes fewer than ``prune_updates`` target updates). Both are
    kept as the published runs used them: counting GST's over the training updates too would change
    ``gst_td3_mujoco``'s numbers.
    """
    total_timesteps = check_positive_int("total_timesteps", total_timesteps)
    prune_updates = check_positive_int("prune_updates", prune_updates)
    if not 0 <= learning_starts < total_timesteps:
        raise ValueError(f"learning_starts must be in [0, total_timesteps), got {learning_starts}")
    sparsity = dict(sparsity)
    if "max_sparsity" not in sparsity:
        raise ValueError(
            f"sparsity must give max_sparsity (GST's cap, the baseline's final sparsity), got {sparsity}"
        )
    try:
        RewardAwareConfig(**sparsity)  # an unknown name or a bad value is refused here, not at the first step
    except TypeError as e:
        raise ValueError(f"sparsity takes rlq.compress.RewardAwareConfig's fields: {e}") from None
    gst: dict[str, Any] = {
        "block_schedule": [tuple(pair) for pair in block_schedule],
        "bc_end": bc_end,
        "prune_every": max(1, total_timesteps // prune_updates),
        "sparsity": sparsity,
    }
    if s_shift is not None:
        gst["s_shift"] = s_shift
    if transition_method is not None:
        gst["transition_method"] = transition_method
    # rounded: 0.8 - 0.2 is 0.6000000000000001 in floats, and the window must be exactly 0.6 of the updates
    window = round(PRUNING_END_FRACTION - PRUNING_START_FRACTION, 9)
    pruning = {
        "final_sparsity": sparsity["max_sparsity"],
        "start_fraction": PRUNING_START_FRACTION,
        "end_fraction": PRUNING_END_FRACTION,
        "update_every": max(1, int(window * (total_timesteps - learning_starts)) // prune_updates),
    }
    return {"gst": gst, "pruning": pruning}


def td3_hyperparams(
    total_timesteps: int,
    *,
    learning_starts: int,
    batch_size: int,
    action_noise_std: float,
    net_arch: Sequence[int],
) -> dict[str, Any]:
    """Return TD3's arguments: Gaussian action noise, hidden widths, and a buffer no larger than the run's steps.

    The buffer never holds more than ``total_timesteps`` transitions (at most :data:`MAX_BUFFER_SIZE`), so
    checkpoints of short runs stay small.
    """
    return {
        "learning_starts": learning_starts,
        "batch_size": batch_size,
        "action_noise_std": action_noise_std,
        "buffer_size": min(MAX_BUFFER_SIZE, total_timesteps),
        "policy_kwargs": {"net_arch": list(net_arch)},
    }


# --------------------------------------------------------------------------------------------------------
# Jobs: which runs a notebook trains


def arm_settings(method: str, gst: dict[str, Any]) -> dict[str, Any]:
    """Return the GST settings of ablation arm ``method`` (:data:`ABLATION_ARMS`): ``gst`` with the earlier
    settings, then the arm's fix, laid over it (the ``sparsity`` dicts merged key by key)."""
    if method not in ABLATION_ARMS:
        raise ValueError(f"unknown GST ablation arm {method!r}; choose one of {sorted(ABLATION_ARMS)}")
    merged = dict(gst)
    for layer in (EARLIER_GST, ABLATION_ARMS[method]):
        merged |= {k: v for k, v in layer.items() if k != "sparsity"}
        merged["sparsity"] = {**merged.get("sparsity", {}), **layer.get("sparsity", {})}
    if method == "gst_only_controller":  # the fixed controller backs off as plain GST does
        merged["sparsity"]["backoff"] = gst.get("sparsity", {}).get("backoff", 0.05)
    return merged
