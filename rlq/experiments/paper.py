"""The papers' reference numbers (``data/paper/*.csv``), so notebooks can put them beside ours."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rlq.experiments.paths import data_dir

COLUMNS = ["paper", "experiment", "algorithm", "environment", "metric", "value", "unit", "note"]


def paper_numbers(paper: str | None = None, folder: str | Path | None = None, **filters: str) -> pd.DataFrame:
    """Return the papers' numbers as tidy rows, optionally of one ``paper`` and matching column ``filters``.

    Example: ``paper_numbers("gst", experiment="a2c_atari", metric="avg_compression_ratio")``.
    """
    folder = Path(folder) if folder is not None else data_dir() / "paper"
    files = sorted(folder.glob("*.csv")) if paper is None else [folder / f"{paper}.csv"]
    missing = [f for f in files if not f.exists()]
    if missing or not files:
        known = ", ".join(p.stem for p in sorted(folder.glob("*.csv"))) or "none"
        raise ValueError(f"no paper numbers for {paper!r} in {folder}; known papers: {known}")
    frame = pd.concat([pd.read_csv(f, dtype={"unit": str, "note": str}) for f in files], ignore_index=True)
    if list(frame.columns) != COLUMNS:
        raise ValueError(f"paper CSVs must have the columns {COLUMNS}, got {list(frame.columns)}")
    for column, wanted in filters.items():
        if column not in COLUMNS:
            raise ValueError(f"unknown column {column!r}; columns are {COLUMNS}")
        frame = frame[frame[column] == wanted]
    return frame.reset_index(drop=True)


def paper_value(paper: str, metric: str, **filters: str) -> float:
    """Return the single number the paper reports for ``metric`` (raise if none or several rows match)."""
    rows = paper_numbers(paper, metric=metric, **filters)
    if len(rows) != 1:
        raise LookupError(
            f"{len(rows)} rows of {paper} match metric={metric!r} {filters}; narrow the filters"
        )
    return float(rows["value"].iloc[0])
