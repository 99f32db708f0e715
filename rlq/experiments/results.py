"""Committed results: small CSVs of full-scale runs under ``data/results/`` that notebooks show without retraining.

``rlq publish RUN_DIR`` copies a finished run's top-level CSVs with its ``params.json`` and ``results.json``
into ``data/results/<experiment>/<preset>/``; notebooks read them back with :func:`load_committed` and
:func:`load_committed_results`. Results published before a method was renamed keep their old names on disk;
both readers map them to today's (:func:`normalize_method_names`), so the committed files need no rewrite.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from rlq.core.jsonio import read_json, write_json
from rlq.experiments.paths import data_dir
from rlq.experiments.run_folders import PARAMS_FILE, RESULTS_FILE, run_state

LEGACY_METHOD_NAMES = {"gradual": "pruning", "magnitude_pruning": "pruning"}
"""Earlier names of a compression method -> its name today: Zhu & Gupta's iterative-pruning baseline is ``pruning``."""

_LEGACY_WORD = re.compile(
    r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, LEGACY_METHOD_NAMES)) + r")(?![A-Za-z0-9])"
)

Named = TypeVar("Named", pd.DataFrame, dict)


def _rename(text: Any) -> Any:
    return (
        _LEGACY_WORD.sub(lambda m: LEGACY_METHOD_NAMES[m.group(1)], text) if isinstance(text, str) else text
    )


def normalize_method_names(data: Named) -> Named:
    """Return ``data`` with every legacy method name (:data:`LEGACY_METHOD_NAMES`) replaced by today's.

    A table: the values of its ``method`` column and the words of its column labels (``"ours gradual"`` becomes
    ``"ours pruning"``). A ``results.json`` or ``params.json`` dict: its keys (``gradual_test_accuracy``,
    ``gradual_final_sparsity``) and its string values, in lists and nested dicts too. A name is replaced
    where it stands as a word or before an underscore, not inside another word.
    """
    if isinstance(data, pd.DataFrame):
        frame = data.rename(columns=_rename)
        if "method" in frame.columns:
            frame["method"] = frame["method"].map(
                lambda v: LEGACY_METHOD_NAMES.get(v, v) if isinstance(v, str) else v
            )
        return frame
    if isinstance(data, dict):
        return {_rename(k): _normalize_value(v) for k, v in data.items()}
    raise TypeError(f"expected a pandas DataFrame or a dict, got {type(data).__name__}")


def _normalize_value(value: Any) -> Any:
    if isinstance(value, dict):
        return normalize_method_names(value)
    if isinstance(value, list):
        return [_normalize_value(v) for v in value]
    return LEGACY_METHOD_NAMES.get(value, value) if isinstance(value, str) else value


def committed_dir(experiment: str, preset: str) -> Path:
    """Return the folder holding the committed results of ``experiment`` at ``preset``."""
    return data_dir() / "results" / experiment / preset


def load_committed(experiment: str, preset: str, table: str) -> pd.DataFrame | None:
    """Return the committed table ``<table>.csv`` of ``experiment`` at ``preset`` (method names as today), or None."""
    path = committed_dir(experiment, preset) / f"{table}.csv"
    return normalize_method_names(pd.read_csv(path)) if path.exists() else None


def load_committed_results(experiment: str, preset: str) -> dict[str, Any] | None:
    """Return the committed ``results.json`` of ``experiment`` at ``preset`` (method names as today), or None."""
    path = committed_dir(experiment, preset) / RESULTS_FILE
    return normalize_method_names(read_json(path)) if path.exists() else None


FREE_KEYS = frozenset(
    {
        "seed",
        "seeds",
        "workers",
        "executor",
        "ray_address",
        "torch_threads",
        "checkpoint_every",
        "show_committed",
        "eval_episodes",
    }
)
"""Parameters a run may change and still answer its preset's claims: how many seeds, how it runs, what it shows."""

_NAME = re.compile(r"[a-z0-9][a-z0-9_]*")
_RESOLVED: dict[tuple[str, str | None], dict[str, Any]] = {}


def variant_params(experiment: str, preset: str | None, params: dict[str, Any]) -> list[str]:
    """Return the parameters (outside :data:`FREE_KEYS`) in which ``params`` depart from ``experiment``'s ``preset``.

    A run with any is a variant of its preset (an ablation, say) and answers none of its claims. An unknown
    experiment or preset gives none, and parameters the notebook has gained since the run are not held
    against it.
    """
    from rlq.experiments.registry import ExperimentError, get_experiment

    if (experiment, preset) not in _RESOLVED:
        try:
            _RESOLVED[experiment, preset] = get_experiment(experiment).resolve(preset)
        except ExperimentError:
            _RESOLVED[experiment, preset] = {}
    expected = _RESOLVED[experiment, preset]
    params = normalize_method_names(params)  # published before a method was renamed
    return sorted(k for k, v in expected.items() if k not in FREE_KEYS and k in params and params[k] != v)


def publish(
    run_dir: str | Path, overwrite: bool = False, dest: str | Path | None = None, name: str | None = None
) -> Path:
    """Return the folder a finished run's CSVs, parameters and numbers were copied to.

    Into ``data/results/<experiment>/<preset>/``, or ``<experiment>/<name>/`` with ``name``; both only with
    the registry's experiment names. Refuses a run that did not finish (``status`` other than ``ok``), a
    variant of its preset (:func:`variant_params`) under the preset's name (it goes under a ``name`` of its
    own) and, unless ``overwrite``, a destination that already holds results. The destination is replaced
    as a whole: no file of an earlier publish stays beside the new one.
    """
    run_dir = Path(run_dir)
    if not (run_dir / RESULTS_FILE).is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no {RESULTS_FILE})")
    results = read_json(run_dir / RESULTS_FILE)
    state = run_state(run_dir, results)
    if state != "ok":
        raise ValueError(f"{run_dir}: the run is {state}; only finished runs are published")
    experiment, preset = results.get("experiment"), results.get("preset")
    if not experiment or not preset:
        raise ValueError(f"{run_dir}: results.json names no experiment or preset")
    if name is not None and not _NAME.fullmatch(name):
        raise ValueError(f"publish name {name!r} must be lower-case letters, digits and underscores")
    if dest is None:  # into data/results: only the registry's experiment and preset names, no path in them
        from rlq.experiments.registry import get_experiment

        known = get_experiment(str(experiment)).presets
        if preset not in known:
            raise ValueError(
                f"{run_dir}: preset {preset!r} is not one of {experiment}'s presets {sorted(known)}"
            )
        changed = variant_params(str(experiment), str(preset), read_json(run_dir / PARAMS_FILE))
        if name in (None, preset) and changed:
            raise ValueError(
                f"{run_dir} is a variant of {experiment}'s {preset} preset (it changes {', '.join(changed)}); "
                f"publish it under a name of its own: rlq publish {run_dir} --as {preset}_{changed[0]}"
            )
        if name in known and name != preset:
            raise ValueError(f"{name!r} is another preset of {experiment}; a variant's name must not be one")
    target = Path(dest) if dest is not None else committed_dir(experiment, name or preset)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} already holds published results; pass --overwrite to replace them")
    staging = target.with_name(f".{target.name}.publishing")
    shutil.rmtree(staging, ignore_errors=True)  # left by a publish that was killed
    staging.mkdir(parents=True)
    for csv in sorted(run_dir.glob("*.csv")):
        shutil.copy2(csv, staging / csv.name)
    shutil.copy2(run_dir / PARAMS_FILE, staging / PARAMS_FILE)
    write_json(staging / RESULTS_FILE, {**results, "run_folder": run_dir.name})
    old = target.with_name(f".{target.name}.replaced")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target
