"""What an rlq training callback was built with, as plain JSON data.

A run folder records it beside the run's other settings and refuses to resume under other ones; the
callbacks' own checkpoint state checks the same from the inside when a schedule resumes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback

from rlq.core.jsonio import json_safe
from rlq.sb3.compression import CompressionCallback
from rlq.sb3.gst_callback import GSTCallback
from rlq.sb3.pruning_callback import GradualPruningCallback
from rlq.sb3.qat_callback import QATCallback

RECORDING = ("skip_first_last", "reward_window", "log_every", "cache_rollouts")
"""What every compression callback records by (:class:`CompressionCallback`'s knobs)."""

QAT = ("bits", "delay_steps", "activations", "per_channel", "convert_at_end", "skip_first_last", "networks")
""":class:`QATCallback`'s knobs."""


def callback_settings(callback: BaseCallback) -> dict[str, Any]:
    """Return ``{"callback": class name, ...its knobs}`` for an rlq compression or QAT callback, as JSON data."""
    if isinstance(callback, QATCallback):
        knobs = {name: getattr(callback, name) for name in QAT}
    elif isinstance(callback, CompressionCallback):
        knobs = {name: getattr(callback, name) for name in RECORDING}
        if isinstance(callback, GSTCallback):
            config = callback.config
            knobs["gst"] = (
                dataclasses.asdict(config)
                if config is not None
                else {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
                      for k, v in callback._config_kwargs.items()}
            )  # fmt: skip
        elif isinstance(callback, GradualPruningCallback):
            knobs["pruning"] = {
                k: v
                for k, v in dataclasses.asdict(callback._settings).items()
                if k not in ("total_steps", "start_step")
            }
    else:
        raise TypeError(
            f"{type(callback).__name__} is not an rlq compression or QAT callback "
            "(CompressionCallback, GSTCallback, GradualPruningCallback, QATCallback)"
        )
    return {"callback": type(callback).__name__, **json_safe(knobs)}
