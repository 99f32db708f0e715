"""What a compression callback records over training: history rows, event rows, the average ratio.

:class:`CompressionHistory` holds the rows of :class:`rlq.sb3.compression.CompressionCallback`: one
history row per action and every ``log_every`` steps (:data:`HISTORY_COLUMNS`), one event row per
structural change or pruning update (:data:`EVENT_COLUMNS`), and GST's headline measure, the compression
ratio averaged over training (:meth:`CompressionHistory.average_compression_ratio`).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from rlq.compress import average_compression_ratio

HISTORY_COLUMNS = ["step", "event", "phase", "block_size", "target_sparsity", "sparsity", "compression_ratio"]
HISTORY_COLUMNS += ["mean_reward", "episodes", "decision"]
"""Columns of :attr:`rlq.sb3.compression.CompressionCallback.history`."""

EVENT_COLUMNS = [
    "step",
    "kind",
    "block_size",
    "sparsity",
    "method",
    "layers",
    "covered_fraction",
    "mean_shift",
]
"""Columns of :attr:`rlq.sb3.compression.CompressionCallback.events` (one row per structural change or
pruning update)."""


class CompressionHistory:
    """The history and event rows of one compression callback, and the state a checkpoint keeps of them."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        """History rows, each with the keys of :data:`HISTORY_COLUMNS`."""
        self.events: list[dict[str, Any]] = []
        """Event rows, each with the keys of :data:`EVENT_COLUMNS`."""

    @property
    def last_step(self) -> int | None:
        """Return the step of the last history row (None before the first)."""
        return self.rows[-1]["step"] if self.rows else None

    def add_row(self, row: dict[str, Any]) -> None:
        """Append a history row: ``row``'s values of :data:`HISTORY_COLUMNS` (None for those it lacks)."""
        self.rows.append({k: row.get(k) for k in HISTORY_COLUMNS})

    def add_event(self, row: dict[str, Any]) -> None:
        """Append an event row: ``row``'s values of :data:`EVENT_COLUMNS` (None for those it lacks)."""
        self.events.append({k: row.get(k) for k in EVENT_COLUMNS})

    def frame(self) -> pd.DataFrame:
        """Return the history rows as a DataFrame with :data:`HISTORY_COLUMNS`."""
        return pd.DataFrame(self.rows, columns=HISTORY_COLUMNS)

    def event_frame(self) -> pd.DataFrame:
        """Return the event rows as a DataFrame with :data:`EVENT_COLUMNS`."""
        return pd.DataFrame(self.events, columns=EVENT_COLUMNS)

    def average_compression_ratio(self, start: int, end: int | None, total_steps: int | None) -> float:
        """Return the compression ratio averaged over training steps ``[start, end)``.

        ``end`` None: the step after the last row, or ``total_steps`` if later. Each history row's ratio
        holds until the next row.
        """
        history = self.frame().drop_duplicates("step", keep="last")
        if history.empty:
            raise ValueError("no history yet: train with this callback first")
        last = int(history["step"].iloc[-1])
        end = max(last + 1, total_steps or 0) if end is None else int(end)
        if end <= start:
            raise ValueError(f"end_step {end} must exceed start_step {start}")
        before = history[history["step"] <= start]
        after = history[(history["step"] > start) & (history["step"] < end)]
        first_value = (
            before["compression_ratio"].iloc[-1] if len(before) else history["compression_ratio"].iloc[0]
        )
        values = [float(first_value), *after["compression_ratio"].astype(float)]
        steps = [start, *after["step"].astype(int)]
        return average_compression_ratio(values, steps, end)

    def load_rows(self, rows: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
        """Restore rows saved as JSON (where NaN became None: ``mean_reward``, ``mean_shift``)."""
        self.rows = [
            {k: (float("nan") if k == "mean_reward" and v is None else v) for k, v in row.items()}
            for row in rows
        ]
        self.events = [
            {k: (float("nan") if k == "mean_shift" and v is None else v) for k, v in row.items()}
            for row in events
        ]
