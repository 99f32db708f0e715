"""Committed results: small CSVs of full-scale runs under ``data/results/`` that notebooks show without retraining.

``rlq publish RUN_DIR`` copies a finished run's top-level CSVs with its ``params.json`` and ``results.json``
into ``data/results/<experiment>/<preset>/``; notebooks read them back with :func:`load_committed`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from rlq.core.jsonio import read_json, write_json
from rlq.experiments.paths import data_dir
from rlq.experiments.runs import PARAMS_FILE, RESULTS_FILE


def committed_dir(experiment: str, preset: str) -> Path:
    """Return the folder holding the committed results of ``experiment`` at ``preset``."""
    return data_dir() / "results" / experiment / preset


def load_committed(experiment: str, preset: str, table: str) -> pd.DataFrame | None:
    """Return the committed table ``<table>.csv`` of ``experiment`` at ``preset``, or None if there is none."""
    path = committed_dir(experiment, preset) / f"{table}.csv"
    return pd.read_csv(path) if path.exists() else None


def publish(run_dir: str | Path, overwrite: bool = False, dest: str | Path | None = None) -> Path:
    """Return the folder a finished run's CSVs, parameters and numbers were copied to.

    Refuses a run that did not finish (``status`` other than ``ok``) and, unless ``overwrite``, a
    destination that already holds results.
    """
    run_dir = Path(run_dir)
    if not (run_dir / RESULTS_FILE).is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no {RESULTS_FILE})")
    results = read_json(run_dir / RESULTS_FILE)
    if results.get("status") != "ok":
        raise ValueError(f"{run_dir}: status is {results.get('status')!r}; only finished runs are published")
    experiment, preset = results.get("experiment"), results.get("preset")
    if not experiment or not preset:
        raise ValueError(f"{run_dir}: results.json names no experiment or preset")
    target = Path(dest) if dest is not None else committed_dir(experiment, preset)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(
            f"{target} already holds published results; pass overwrite=True to replace them"
        )
    target.mkdir(parents=True, exist_ok=True)
    for csv in sorted(run_dir.glob("*.csv")):
        shutil.copy2(csv, target / csv.name)
    shutil.copy2(run_dir / PARAMS_FILE, target / PARAMS_FILE)
    write_json(target / RESULTS_FILE, {**results, "run_folder": run_dir.name})
    return target
