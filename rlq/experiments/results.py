"""Committed results: small CSVs of full-scale runs under ``data/results/`` that notebooks show without retraining.

``rlq publish RUN_DIR`` copies a finished run's top-level CSVs with its ``params.json`` and ``results.json``
into ``data/results/<experiment>/<preset>/``; notebooks read them back with :func:`load_committed` and
:func:`load_committed_results`. Results published before a method was renamed keep their old names on disk;
both readers map them to today's (:func:`normalize_method_names`), so the committed files need no rewrite.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from rlq.core.jsonio import read_json, write_json
from rlq.experiments.paths import data_dir
from rlq.experiments.run_folders import (
    PARAMS_FILE,
    RESULTS_FILE,
    RUN_FILES_FOLDER,
    RUN_FILES_MAX_BYTES,
    run_state,
)

LEGACY_METHOD_NAMES = {"gradual": "pruning", "magnitude_pruning": "pruning"}
"""Earlier names of a compression method -> its name today: Zhu & Gupta's iterative-pruning baseline is ``pruning``."""

_LEGACY_WORD = re.compile(
    r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, LEGACY_METHOD_NAMES)) + r")(?![A-Za-z0-9])"
)

Named = TypeVar("Named", pd.DataFrame, dict)
log = logging.getLogger(__name__)


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


PLUMBING_KEYS = frozenset(
    {"workers", "executor", "ray_address", "torch_threads", "checkpoint_every", "show_committed"}
)
"""Parameters of how a run was executed and shown, which leave each of its trainings as it is."""
FREE_KEYS = PLUMBING_KEYS | {"seed", "seeds"}
"""Parameters a run may change and still answer its preset's claims: how it runs and shows, and its seeds
(how many seeds a claim needs, the claim itself says). Anything else, ``eval_episodes`` included, changes
what the run measures."""

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
    the registry's experiment names. The run's :data:`RUN_FILES_FOLDER` (its final actors), when it has one,
    is copied too, and refused above :data:`RUN_FILES_MAX_BYTES`. Refuses a run that did not finish (``status`` other than ``ok``), a
    variant of its preset (:func:`variant_params`) under the preset's name (it goes under a ``name`` of its
    own) and, unless ``overwrite``, a destination that already holds results. The destination is replaced
    as a whole (no file of an earlier publish stays beside the new one): the new folder is written beside it
    and swapped in (:func:`replace_folder`), so a publish killed at any moment leaves the old folder or the
    new one, in place or, where the file system cannot swap folders, moved aside; a publish first puts back
    what a killed one left (:func:`recover_folder`).
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
        _check_preset_name(run_dir, str(experiment), str(preset), name)
    target = Path(dest) if dest is not None else committed_dir(experiment, name or preset)
    recover_folder(target)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} already holds published results; pass --overwrite to replace them")
    run_files = _run_files(run_dir)
    staging = _staging(target)
    staging.mkdir(parents=True)
    for csv in sorted(run_dir.glob("*.csv")):
        shutil.copy2(csv, staging / csv.name)
    shutil.copy2(run_dir / PARAMS_FILE, staging / PARAMS_FILE)
    if run_files:
        shutil.copytree(run_dir / RUN_FILES_FOLDER, staging / RUN_FILES_FOLDER)
    write_json(staging / RESULTS_FILE, {**results, "run_folder": run_dir.name})
    replace_folder(staging, target)
    return target


def _run_files(run_dir: Path) -> list[Path]:
    """Return the files of ``run_dir``'s :data:`RUN_FILES_FOLDER`, after checking they are small enough to publish."""
    folder = run_dir / RUN_FILES_FOLDER
    files = sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    size = sum(p.stat().st_size for p in files)
    if size > RUN_FILES_MAX_BYTES:
        raise ValueError(
            f"{folder} holds {size / 1e6:.1f} MB, more than the {RUN_FILES_MAX_BYTES / 1e6:g} MB a published run may "
            "carry: save each actor alone (rlq.sb3.checkpoint.save_dense_actor)"
        )
    return files


def _check_preset_name(run_dir: Path, experiment: str, preset: str, name: str | None) -> None:
    """Raise unless ``preset`` is one of ``experiment``'s and the run may be published under ``name`` (or it)."""
    from rlq.experiments.registry import get_experiment

    known = get_experiment(experiment).presets
    if preset not in known:
        raise ValueError(f"{run_dir}: preset {preset!r} is not one of {experiment}'s presets {sorted(known)}")
    changed = variant_params(experiment, preset, read_json(run_dir / PARAMS_FILE))
    if name in (None, preset) and changed:
        raise ValueError(
            f"{run_dir} is a variant of {experiment}'s {preset} preset (it changes {', '.join(changed)}); "
            f"publish it under a name of its own: rlq publish {run_dir} --as {preset}_{changed[0]}"
        )
    if name in known and name != preset:
        raise ValueError(f"{name!r} is another preset of {experiment}; a variant's name must not be one")


def _staging(target: Path) -> Path:
    return target.with_name(f".{target.name}.publishing")


def _aside(target: Path) -> Path:
    return target.with_name(f".{target.name}.replaced")


def _exchange(a: Path, b: Path) -> bool:
    """Return True after swapping the folders ``a`` and ``b`` in one step (Linux ``renameat2``), False where
    this system or file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def replace_folder(staging: Path, target: Path) -> None:
    """Put the folder ``staging`` at ``target`` and delete the folder that was there, if any.

    The two are swapped in one step where the file system can (then the old folder, now at ``staging``, is
    deleted). Elsewhere the old folder is first moved aside to ``.<name>.replaced``; a kill before the new
    one is in place leaves it there, and :func:`recover_folder` puts it back.
    """
    if not target.exists():
        os.rename(staging, target)
    elif _exchange(staging, target):
        shutil.rmtree(staging)
    else:
        os.rename(target, _aside(target))
        os.rename(staging, target)
        shutil.rmtree(_aside(target))


def recover_folder(target: Path) -> None:
    """Undo what a :func:`replace_folder` that was killed left of ``target``, logging each step as a warning.

    A folder moved aside while ``target`` is missing is put back; one moved aside after the new folder was in
    place (the replace had done its swap) is deleted, as is a half-written or swapped-out staging folder.
    """
    aside, staging = _aside(target), _staging(target)
    if aside.exists() and not target.exists():
        os.rename(aside, target)
        log.warning(
            "rlq: %s was missing: put back from %s, where a stopped publish had moved it", target, aside
        )
    elif aside.exists():
        shutil.rmtree(aside)
        log.warning("rlq: removed %s, the copy a stopped publish had replaced by %s", aside, target)
    if staging.exists():
        shutil.rmtree(staging)  # a stopped publish's new files (or, once swapped, the replaced ones)
