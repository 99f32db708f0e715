"""Where the repository's notebooks, data and run folders live."""

from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    """Return the rlq checkout that holds ``notebooks/`` and ``data/`` (``RLQ_HOME`` overrides)."""
    env = os.environ.get("RLQ_HOME")
    root = Path(env) if env else Path(__file__).resolve().parents[2]
    if not (root / "notebooks").is_dir():
        raise FileNotFoundError(
            f"no notebooks/ folder under {root}: rlq's experiments run from a clone of the repository "
            "(install it with `pip install -e .`), or set RLQ_HOME to that clone"
        )
    return root


def notebooks_dir() -> Path:
    """Return the folder holding one experiment notebook per paper experiment."""
    return Path(os.environ.get("RLQ_NOTEBOOKS", repo_root() / "notebooks"))


def data_dir() -> Path:
    """Return the folder holding the papers' numbers (``paper/``) and committed results (``results/``)."""
    return repo_root() / "data"


def default_runs_dir() -> Path:
    """Return the default parent of run folders: ``runs/`` relative to the current directory."""
    return Path(os.environ.get("RLQ_RUNS", "runs"))
