"""What a compression schedule a classifier trains under must offer: GST, or the pruning baseline (Zhu & Gupta).

Both come from :mod:`rlq.compress` (:class:`rlq.compress.GSTSchedule` and :class:`rlq.compress.GradualPruning`),
built by the experiment from its knobs (``notebooks/gst_classification.ipynb``); :func:`rlq.vision.train_classifier`
calls them through the interface below (:class:`CompressionSchedule`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from torch import nn

from rlq.compress import GSTAction


class CompressionSchedule(Protocol):
    """What :func:`train_classifier` needs of a schedule (:class:`GSTSchedule` and :class:`GradualPruning` fit)."""

    def apply_(
        self, module: nn.Module, step: int, scores: Iterable[float] = (), optimizers: Any = ()
    ) -> list[GSTAction]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
