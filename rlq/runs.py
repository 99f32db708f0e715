"""Run folders: where an experiment's parameters, executed notebook, numbers and checkpoints live.

A run folder is ``<parent>/<experiment>/<UTC timestamp>-<short id>/``. The runner (``rlq run``) creates
it, writes ``params.json``, points the notebook's kernel at it through the ``RLQ_RUN_DIR`` environment
variable, and turns the numbers the notebook records with :func:`record` into ``results.json``.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from datetime import datetime, timezone
from numbers import Integral, Real
from pathlib import Path
from typing import Any

RUN_DIR_ENV = "RLQ_RUN_DIR"
RESULTS_FILE = "results.json"
PARAMS_FILE = "params.json"
NOTEBOOK_FILE = "output.ipynb"
#: Keys of results.json owned by the runner; a notebook may not record them.
RESERVED_KEYS = frozenset({"status", "error", "experiment", "preset", "run_seconds", "started", "finished"})


def utc_stamp(now: datetime | None = None) -> str:
    """Return a compact, sortable UTC timestamp such as ``20261130T051502Z``."""
    return (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def new_run_dir(
    parent: str | Path, name: str, *, now: datetime | None = None, run_id: str | None = None
) -> Path:
    """Return a freshly created ``parent/name/<UTC timestamp>-<short id>/``; never reuses an existing folder."""
    path = Path(parent) / name / f"{utc_stamp(now)}-{run_id or secrets.token_hex(3)}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(exist_ok=False)  # FileExistsError rather than writing into another run's folder
    return path


def run_dir() -> Path:
    """Return this process's run folder: the runner's ``RLQ_RUN_DIR``, or a new ``runs/interactive/...`` one.

    In JupyterLab (no runner) the first call creates a folder and exports it in ``RLQ_RUN_DIR``, so later
    calls in the same kernel, and :func:`record`, use the same folder.
    """
    env = os.environ.get(RUN_DIR_ENV)
    if env:
        path = Path(env)
        path.mkdir(parents=True, exist_ok=True)
        return path
    from rlq.paths import default_runs_dir

    path = new_run_dir(default_runs_dir(), "interactive").resolve()
    os.environ[RUN_DIR_ENV] = str(path)
    return path


def _json_number(name: str, value: Any) -> Any:
    """Return ``value`` as a plain JSON value (numpy scalars become int/float), or raise naming ``name``."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_json_number(name, v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_number(f"{name}.{k}", v) for k, v in value.items()}
    raise TypeError(
        f"record(): {name!r} is a {type(value).__name__}; record numbers, strings, lists or dicts"
    )


def read_json(path: str | Path) -> dict[str, Any]:
    """Return the JSON object stored at ``path`` ({} when the file does not exist)."""
    path = Path(path)
    if not path.exists():
        return {}
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON atomically (a crash never leaves half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def record(**numbers: Any) -> dict[str, Any]:
    """Return the notebook's headline numbers after merging them into its run folder's ``results.json``."""
    clash = RESERVED_KEYS.intersection(numbers)
    if clash:
        raise ValueError(f"record(): {sorted(clash)} are reserved for the runner; choose other names")
    clean = {k: _json_number(k, v) for k, v in numbers.items()}
    path = run_dir() / RESULTS_FILE
    merged = read_json(path)
    merged.update(clean)
    write_json(path, merged)
    return clean


def load_run(path: str | Path) -> dict[str, Any]:
    """Return a run folder's ``params`` and ``results`` with its ``path``, for summaries and reports."""
    path = Path(path)
    return {"path": path, "params": read_json(path / PARAMS_FILE), "results": read_json(path / RESULTS_FILE)}


def list_runs(parent: str | Path, experiment: str | None = None) -> list[Path]:
    """Return the run folders under ``parent`` (optionally of one experiment), oldest first."""
    parent = Path(parent)
    pattern = f"{experiment or '*'}/*/{RESULTS_FILE}"
    return sorted((p.parent for p in parent.glob(pattern)), key=lambda p: p.name)
