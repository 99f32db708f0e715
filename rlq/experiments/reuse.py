"""Reuse finished runs in a new run folder: add seeds to a run without training its earlier seeds again.

``rlq run NAME --preset P -p seeds '[0, 1, 2, 3, 4]' --reuse FOLDER`` puts the finished training runs of
``FOLDER`` into the new run folder's job store (``jobs/``) before the notebook starts; the notebook then loads
them as it loads a resumed run's and trains only the others. ``--retrain method=gst,seed=2`` leaves the runs
it names out of every source, so the new run trains them again (e.g. one run made with a rule the
code no longer follows) and keeps the rest. ``FOLDER`` is a run folder (its saved job
results are copied) or a published one under ``data/results/`` (each run is rebuilt from the published
tables: ``summary``, ``history``, ``curve`` and ``events``, one row group per run). Only experiments whose
jobs train through :func:`rlq.experiments.notebook_jobs.run_notebook_jobs` keep their runs this way.

A source is refused unless it is a finished run of the same experiment whose parameters equal the new run's
apart from which runs it holds (:data:`SELECTION_KEYS`) and how it ran (:data:`rlq.experiments.results.PLUMBING_KEYS`). Two sources
holding the same run, or a run the folder already holds, are refused too: nothing is overwritten. A
``--retrain`` that names no run of the sources is refused as a typo would be.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from rlq.core.jsonio import read_json
from rlq.experiments.results import PLUMBING_KEYS, normalize_method_names
from rlq.experiments.run_folders import PARAMS_FILE, RESULTS_FILE, RUN_FILES_FOLDER, run_state
from rlq.rl.parallel import JOBS_FOLDER, ResultStore

SELECTION_KEYS = frozenset({"seeds", "method_seeds", "methods", "env_ids"})
"""Parameters that choose which runs a folder holds, not how each run trains."""
TABLES = ("summary", "history", "curve", "events")
"""The published tables a run is rebuilt from (``layers`` is not published: a rebuilt run has none)."""


def check_source(source: str | Path, experiment: str, params: dict[str, Any]) -> dict[str, Any]:
    """Return ``source``'s results.json after checking it is a finished run of ``experiment`` run as ``params``."""
    source = Path(source)
    if not (source / RESULTS_FILE).is_file() or not (source / PARAMS_FILE).is_file():
        raise ValueError(
            f"--reuse {source}: not a run folder or published run (no {RESULTS_FILE} and {PARAMS_FILE})"
        )
    results = read_json(source / RESULTS_FILE)
    if results.get("experiment") != experiment:
        raise ValueError(
            f"--reuse {source}: it is a run of {results.get('experiment')!r}, not of {experiment!r}"
        )
    if results.get("status") != "ok" or (
        (source / JOBS_FOLDER).is_dir() and run_state(source, results) != "ok"
    ):
        raise ValueError(f"--reuse {source}: the run did not finish (status {results.get('status')!r})")
    theirs = normalize_method_names(read_json(source / PARAMS_FILE))
    free = SELECTION_KEYS | PLUMBING_KEYS | {"preset"}
    differ = sorted(
        k
        for k in set(params) | set(theirs)
        if k not in free and (k not in params or theirs.get(k, params[k]) != params[k])
    )
    if differ:
        shown = ", ".join(f"{k} {theirs.get(k)!r} (this run: {params.get(k)!r})" for k in differ)
        raise ValueError(f"--reuse {source}: its runs trained with other settings: {shown}")
    return results


def wanted(key: dict[str, Any], params: dict[str, Any]) -> bool:
    """Return True when the run named ``key`` is one the run with ``params`` trains (its task, method and seed)."""
    method_seeds = params.get("method_seeds") or {}
    checks = {
        "env_id": params.get("env_ids"),
        "method": params.get("methods"),
        "seed": method_seeds.get(key.get("method"), params.get("seeds")),
    }
    return all(
        key.get(name) in allowed for name, allowed in checks.items() if name in key and allowed is not None
    )


def saved_runs(source: Path) -> list[tuple[dict[str, Any], Any]]:
    """Return the (key, result) of every job result saved in the run folder ``source``.

    The job store is data (:class:`rlq.rl.parallel.ResultStore`): results saved as pickles are refused
    with what to do (:class:`rlq.rl.parallel.PickledResults`), and a damaged file is named.
    """
    return [(key, result) for _, key, result in ResultStore(source / JOBS_FOLDER).saved()]


METRIC_COLUMNS = ("eval_return", "eval_std", "final_train_return")
"""The numbers of a run that its experiment pools over seeds: a run holding NaN or an infinity in one of them
is refused by ``--reuse`` and ``--resume``, never averaged away."""


def _metric_rows(result: Any) -> list[dict[str, Any]]:
    """Return the rows of plain numbers a job result holds: its ``summary``, ``training`` and ``rows``."""
    if not isinstance(result, dict):
        return []
    rows = [result[name] for name in ("summary", "training") if isinstance(result.get(name), dict)]
    rows += [row for row in result.get("rows") or [] if isinstance(row, dict)]
    return rows


def run_label(key: dict[str, Any]) -> str:
    """Return a run's key as words, e.g. ``seed 2, method gst, env_id Pendulum-v1`` (the seed first)."""
    ordered = sorted(key.items(), key=lambda item: item[0] != "seed")
    return ", ".join(f"{k} {v}" for k, v in ordered)


def check_finite_metrics(
    key: dict[str, Any], result: Any, path: Path, context: str, advice: str = ""
) -> None:
    """Raise ValueError when a run's :data:`METRIC_COLUMNS` hold NaN or an infinity, naming the run, the column
    and ``path``, after ``context`` (``--reuse FOLDER``); ``advice`` says what to do (default: retrain it)."""
    for row in _metric_rows(result):
        for column in METRIC_COLUMNS:
            value = _native(row.get(column))
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isfinite(value):
                spec = ",".join(f"{k}={v}" for k, v in key.items())
                todo = advice or f"leave it out with --retrain {spec}, which trains it again"
                raise ValueError(
                    f"{context}: run {run_label(key)} has {column} = {value} in {path}; a run's metrics must be "
                    f"finite to be pooled over seeds: {todo}"
                )


def check_job_store(run_folder: Path, context: str) -> None:
    """Raise ValueError when the job store of ``run_folder`` cannot be pooled as it is, after ``context``.

    Refused: results saved as pickles (:class:`rlq.rl.parallel.PickledResults`), a damaged result, and
    a run whose metrics are not finite (:func:`check_finite_metrics`); each error names the file and what to do.
    """
    for path, key, result in ResultStore(Path(run_folder) / JOBS_FOLDER).saved():
        advice = f"move {path.name} out of {path.parent}, and that run trains again"
        check_finite_metrics(key, result, path, context, advice)


def _native(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def published_runs(source: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Return the (key, result) of every run in the published folder ``source``, rebuilt from its tables.

    A run's key is its values of the columns every table but ``events`` shares (task, seed, method, and a
    sweep's own labels), in the summary's column order, as the job that trained it named them.
    """
    missing = [name for name in TABLES if not (source / f"{name}.csv").is_file()]
    if missing:
        raise ValueError(
            f"--reuse {source}: no {', '.join(m + '.csv' for m in missing)}; its runs cannot be rebuilt"
        )
    tables = {  # round_trip: every float as it was written, to the last digit
        name: normalize_method_names(pd.read_csv(source / f"{name}.csv", float_precision="round_trip"))
        for name in TABLES
    }
    summary = tables["summary"]
    key_columns = [c for c in summary.columns if all(c in tables[t].columns for t in ("history", "curve"))]
    if not {"env_id", "seed", "method"} <= set(key_columns):
        raise ValueError(f"--reuse {source}: its tables do not name each run's env_id, seed and method")
    runs = []
    for row in summary.to_dict("records"):
        key = {c: _native(row[c]) for c in key_columns}

        def rows(table: pd.DataFrame, key: dict[str, Any] = key) -> pd.DataFrame:
            if table.empty or not set(key) <= set(table.columns):
                return table.iloc[0:0].reset_index(drop=True)
            match = pd.Series(True, index=table.index)
            for c, v in key.items():
                match &= table[c] == v
            return table[match].reset_index(drop=True)

        result = {
            "keys": dict(key),
            "summary": {k: _native(v) for k, v in row.items()},
            **{name: rows(tables[name]) for name in ("history", "curve", "events")},
            "layers": pd.DataFrame(),
        }
        runs.append((key, result))
    return runs


Plan = list[tuple[Path, dict[str, Any], list[tuple[dict[str, Any], Any]]]]
"""Each source with its results.json and the (key, result) of the runs taken from it."""


def _run_file_copies(plan: Plan, folder: Path) -> list[tuple[Path, Path]]:
    """Return (source file, target) for every file of the sources' :data:`RUN_FILES_FOLDER`, into ``folder``;
    a file ``folder`` holds already, or two sources hold, is refused (FileExistsError, naming both)."""
    copies: dict[Path, Path] = {}
    for source, _, _ in plan:
        origin = Path(source) / RUN_FILES_FOLDER
        for file in sorted(p for p in origin.rglob("*") if p.is_file()) if origin.is_dir() else []:
            target = folder / file.relative_to(origin)
            if target.exists() or target in copies:
                holder = (
                    f"also in {copies[target].parent.parent}"
                    if target in copies
                    else "already in the run folder"
                )
                raise FileExistsError(f"--reuse {source}: {target} is {holder}; it is not replaced")
            copies[target] = file
    return [(file, target) for target, file in copies.items()]


def parse_run_spec(text: str) -> dict[str, Any]:
    """Return the run fields named by ``--retrain`` text such as ``method=gst,seed=2`` (integers as int)."""
    spec: dict[str, Any] = {}
    for part in (p.strip() for p in str(text).split(",")):
        field, sep, value = part.partition("=")
        field, value = field.strip(), value.strip()
        if not sep or not field or not value:
            raise ValueError(
                f"--retrain {text!r}: write the run as FIELD=VALUE pairs, e.g. method=gst,seed=2"
            )
        if field in spec:
            raise ValueError(f"--retrain {text!r}: {field} is given twice")
        spec[field] = int(value) if value.lstrip("-").isdigit() else value
    return spec


def matches(key: dict[str, Any], spec: dict[str, Any]) -> bool:
    """Return True when the run named ``key`` has every field value ``spec`` names."""
    return all(field in key and str(key[field]) == str(value) for field, value in spec.items())


def plan_reuse(
    sources: Sequence[str | Path], experiment: str, params: dict[str, Any], retrain: Sequence[str] = ()
) -> Plan:
    """Return the runs to take from each of ``sources`` for a run of ``experiment`` with ``params``, all checked.

    Runs matching one of the ``retrain`` specs (:func:`parse_run_spec`) are taken from no source: the new
    run trains them. A spec that matches none of the runs the sources hold for this run is refused.
    """
    if retrain and not sources:
        raise ValueError("--retrain names runs of the --reuse folders: give --reuse FOLDER")
    specs = [(text, parse_run_spec(text)) for text in retrain]
    matched: set[str] = set()
    plan, taken = [], {}
    for source in map(Path, sources):
        results = check_source(source, experiment, params)
        runs = saved_runs(source) if (source / JOBS_FOLDER).is_dir() else published_runs(source)
        runs = [(key, result) for key, result in runs if wanted(key, params)]
        if not runs:
            raise ValueError(f"--reuse {source}: it holds none of this run's tasks, methods and seeds")
        kept = []
        for key, result in runs:
            hits = [text for text, spec in specs if matches(key, spec)]
            matched.update(hits)
            if not hits:
                kept.append((key, result))
        if not kept:
            raise ValueError(f"--reuse {source}: --retrain names every run it holds; leave this --reuse out")
        runs = kept
        for key, result in runs:
            where = ResultStore(source / JOBS_FOLDER).path(key) if (source / JOBS_FOLDER).is_dir() else None
            check_finite_metrics(key, result, where or source / "summary.csv", f"--reuse {source}")
        for key, _ in runs:
            name = ResultStore(".").path(key).name
            if name in taken:
                raise ValueError(
                    f"--reuse {source}: run {key} is also in {taken[name]}; reuse it from one folder"
                )
            taken[name] = str(source)
        plan.append((source, results, runs))
    unmatched = [text for text, _ in specs if text not in matched]
    if unmatched:
        raise ValueError(
            f"--retrain {unmatched[0]}: no run of the --reuse folders that this run trains has those values"
        )
    return plan


def _headline(result: Any) -> dict[str, Any]:
    """Return a run's numbers from its summary row (compression, returns, episodes), for the record of a retrain."""
    summary = result.get("summary") if isinstance(result, dict) else getattr(result, "summary", None)
    if isinstance(summary, pd.DataFrame):
        summary = summary.iloc[0].to_dict() if len(summary) else {}
    if not isinstance(summary, dict):
        return {}
    out = {}
    for k, v in summary.items():
        v = _native(v)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "wall_time_s" and v == v:
            out[str(k)] = v
    return out


def replaced_runs(
    sources: Sequence[str | Path], experiment: str, params: dict[str, Any], retrain: Sequence[str]
) -> list[dict[str, Any]]:
    """Return each run of ``sources`` that a ``retrain`` spec replaces: the spec, its source, key and numbers.

    A run folder's ``results.json`` keeps this under ``retrained``, so that what a merge replaced stays on
    record beside the run that replaced it.
    """
    specs = [(text, parse_run_spec(text)) for text in retrain]
    out = []
    for source in map(Path, sources):
        runs = saved_runs(source) if (source / JOBS_FOLDER).is_dir() else published_runs(source)
        for key, result in runs:
            if not wanted(key, params):
                continue
            for text, spec in specs:
                if matches(key, spec):
                    out.append(
                        {"run": text, "source": str(source), "key": key, "replaced": _headline(result)}
                    )
                    break
    return out


def save_reuse(plan: Plan, path: str | Path) -> list[dict[str, Any]]:
    """Return what was reused from each source (its path, runs, keys, training seconds), after saving the runs
    of ``plan`` in the run folder ``path``'s job store and copying each source's :data:`RUN_FILES_FOLDER` (its
    runs' final actors) into ``path``'s. A run the store already holds, or a file the folder already holds, is
    refused before anything is written; a run that is trained again writes its own files over those copied."""
    store = ResultStore(Path(path) / JOBS_FOLDER)
    for _source, _, runs in plan:
        for key, _ in runs:
            if store.path(key).exists():
                raise FileExistsError(
                    f"{store.path(key)} already holds run {key}; it is not replaced by --reuse"
                )
    copies = _run_file_copies(plan, Path(path) / RUN_FILES_FOLDER)
    for source_file, target in copies:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source_file, target)
    reused = []
    for source, results, runs in plan:
        for key, result in runs:
            store.save(key, result)
        reused.append({
            "source": str(source), "runs": len(runs), "keys": [key for key, _ in runs],
            "train_seconds": results.get("train_seconds", results.get("run_seconds")),
        })  # fmt: skip
    return reused
