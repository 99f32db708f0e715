"""Parameter sweeps: one ordinary run of an experiment notebook per point of a grid, in one sweep folder.

A sweep folder is ``<out>/sweeps/<experiment>/<UTC timestamp>-<short id>/``. It holds ``sweep.json`` (the
experiment, preset, fixed ``-p`` overrides, the grid, and per point its grid values, full parameters, run
folder and status), ``summary.csv`` (one row per point: its grid values, status and the numbers its
notebook recorded) and, when ``seed`` is a grid key, ``seeds.csv`` (per point of the other grid keys and
per recorded number: the IQM over seeds with its 95% bootstrap interval, :func:`rlq.stats.estimate`,
plus mean and standard deviation). Each point's run folder is ``<sweep folder>/<experiment>/<timestamp>-<id>/``,
an ordinary run folder that ``rlq report`` and ``rlq run --resume`` understand.

Points are jobs of :func:`rlq.rl.parallel.run_jobs`, so they run in local processes or on Ray, ``max_parallel``
at a time; a failed point does not stop the others. :func:`resume_sweep` runs again only the points that
are missing, failed or interrupted (an interrupted point resumes in its own run folder, from its checkpoints).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from rlq.core.jsonio import read_json, write_json
from rlq.experiments.registry import Experiment, ExperimentError, get_experiment, parse_value
from rlq.experiments.run_folders import PARAMS_FILE, RESULTS_FILE, new_run_dir, run_state, utc_stamp
from rlq.experiments.runner import check_out_dir, execute, resume_run

log = logging.getLogger(__name__)

SWEEP_FILE = "sweep.json"
SUMMARY_FILE = "summary.csv"
SEEDS_FILE = "seeds.csv"
SWEEPS_FOLDER = "sweeps"
"""The folder under a runs folder that holds sweep folders (``<runs>/sweeps/<experiment>/<sweep>/``)."""
_NOT_NUMBERS = frozenset({"status", "error", "experiment", "preset", "started", "finished"})


def split_values(text: str) -> list[str]:
    """Return ``text`` split at the commas outside brackets and quotes (``[1, 2],[3]`` is two values)."""
    values, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[({":
            depth += 1
        elif char in "])}":
            depth -= 1
        elif char == "," and depth == 0:
            values.append(text[start:i].strip())
            start = i + 1
    values.append(text[start:].strip())
    return values


def parse_grid(experiment: Experiment, grid: Sequence[str]) -> dict[str, list[tuple[str, Any]]]:
    """Return each ``KEY=V1,V2,...`` of ``grid`` as ``{key: [(text, value), ...]}``, or raise ExperimentError."""
    if not grid:
        raise ExperimentError("a sweep needs at least one --grid KEY=V1,V2,...")
    parsed: dict[str, list[tuple[str, Any]]] = {}
    for item in grid:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ExperimentError(f"--grid {item!r}: expected KEY=V1,V2,...")
        if key in parsed:
            raise ExperimentError(f"--grid {key}: given more than once")
        if key not in experiment.parameters:
            raise ExperimentError(
                f"--grid {key}: experiment {experiment.name!r} has no parameter {key!r}; its parameters are: "
                f"{', '.join(experiment.parameters)}"
            )
        texts = [t for t in split_values(text) if t] if text.strip() else []
        if not texts:
            raise ExperimentError(f"--grid {key}: no values (an empty grid runs nothing)")
        values = [(t, parse_value(t, experiment.parameters[key])) for t in texts]
        if len({repr(v) for _, v in values}) != len(values):
            raise ExperimentError(f"--grid {key}: a value is repeated")
        parsed[key] = values
    return parsed


MAX_POINTS = 1000
"""The most points a sweep may have: its grid's size is checked before anything is planned or created (a
10^6-point grid once took a minute and 1.6 GB to plan, wrote a 470 MB sweep.json and 5,828 folders, then failed)."""


def plan_points(
    experiment: Experiment,
    preset: str | None,
    overrides: Sequence[tuple[str, str]],
    grid: dict[str, list[tuple[str, Any]]],
) -> list[dict[str, Any]]:
    """Return every grid point (its ``grid`` values and full, validated ``params``), first key outermost."""
    clash = sorted(set(grid) & {key for key, _ in overrides})
    if clash:
        raise ExperimentError(f"{', '.join(clash)}: given both with -p and --grid")
    size = math.prod(len(values) for values in grid.values())
    if size > MAX_POINTS:
        counts = " x ".join(f"{len(values)} {key}" for key, values in grid.items())
        raise ExperimentError(f"the grid has {size} points ({counts}), more than a sweep's {MAX_POINTS}")
    points: list[dict[str, Any]] = [{"grid": {}, "texts": []}]
    for key, values in grid.items():
        points = [
            {"grid": {**p["grid"], key: value}, "texts": [*p["texts"], (key, text)]}
            for p in points
            for text, value in values
        ]
    planned = []
    for point in points:
        params = experiment.resolve(preset, [*overrides, *point["texts"]])  # every point checked up front
        planned.append({"grid": point["grid"], "params": params})
    return planned


def create_sweep(
    name: str,
    grid: Sequence[str],
    preset: str | None = None,
    overrides: Sequence[tuple[str, str]] = (),
    out: str | Path = "runs",
) -> Path:
    """Return a new sweep folder for ``name`` over ``grid``, every input checked before anything is created."""
    experiment = get_experiment(name)
    overrides = [tuple(o) for o in overrides]
    parsed = parse_grid(experiment, grid)
    points = plan_points(experiment, preset, overrides, parsed)
    experiment.check_requirements()
    check_out_dir(out)
    path = new_run_dir(Path(out) / SWEEPS_FOLDER, experiment.name)
    sweep = {
        "experiment": experiment.name,
        "preset": preset,
        "fixed": {key: points[0]["params"][key] for key, _ in overrides},
        "grid": {key: [value for _, value in values] for key, values in parsed.items()},
        "created": utc_stamp(),
        "points": [
            {"index": i, "grid": p["grid"], "params": p["params"], "run": None, "status": "pending"}
            for i, p in enumerate(points)
        ],
    }
    write_json(path / SWEEP_FILE, sweep)
    return path


def run_point(
    experiment: Experiment, params: dict[str, Any], path: str, preset: str | None
) -> dict[str, Any]:
    """Return one point's run status and results: run in its folder, or resumed there after a failed attempt."""
    path_ = Path(path)
    if (path_ / RESULTS_FILE).is_file():
        outcome = resume_run(path_, progress=False)
    else:
        outcome = execute(experiment, params, path_, preset=preset, progress=False)
    return {"status": outcome.status, "results": outcome.results}


def point_label(point: dict[str, Any]) -> str:
    """Return a point's grid values as its name, e.g. ``"seed=1, lr=0.001"``."""
    return ", ".join(f"{k}={v}" for k, v in point["grid"].items())


def resume_sweep(
    path: str | Path,
    *,
    executor: str = "processes",
    ray_address: str | None = None,
    max_parallel: int = 1,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Return the sweep record after running every point that is not finished (missing, failed, interrupted).

    ``on_point(point)`` is called as each point ends. ``sweep.json``, ``summary.csv`` and ``seeds.csv`` are
    rewritten as points end and when the sweep stops, interrupted or not.
    """
    from rlq.rl.parallel import Executor, run_jobs

    path = Path(path)
    sweep = read_json(path / SWEEP_FILE)
    if not sweep.get("points"):
        raise FileNotFoundError(f"{path} is not a sweep folder (no {SWEEP_FILE} with points)")
    experiment = get_experiment(sweep["experiment"])
    refresh_statuses(path, sweep)
    todo = [p for p in sweep["points"] if p["status"] != "ok"]
    for point in todo:  # a point never started, or whose folder was deleted, gets a new run folder
        if not point.get("run") or not (path / point["run"]).is_dir():
            run = new_run_dir(path, experiment.name)
            write_json(run / PARAMS_FILE, point["params"])
            point["run"] = str(run.relative_to(path))
    save(path, sweep)
    jobs = [
        {
            "experiment": experiment,
            "params": p["params"],
            "path": str(path / p["run"]),
            "preset": sweep["preset"],
        }
        for p in todo
    ]

    def ended(index: int, result: dict[str, Any]) -> None:
        todo[index]["status"] = result["status"]
        save(path, sweep)
        if on_point is not None:
            on_point(todo[index])

    try:
        run_jobs(
            run_point, jobs, workers=max_parallel, on_result=ended, labels=[point_label(p) for p in todo],
            executor=Executor(executor, address=ray_address), on_error="keep",
        )  # fmt: skip
    finally:
        refresh_statuses(path, sweep)
        save(path, sweep)
    return sweep


def refresh_statuses(path: Path, sweep: dict[str, Any]) -> None:
    """Set each point's status from its run folder (``pending`` without one, a dead ``running`` is interrupted)."""
    for point in sweep["points"]:
        run = path / point["run"] if point.get("run") else None
        if run is None or not (run / RESULTS_FILE).is_file():
            point["status"] = "pending"
        else:
            try:
                point["status"] = run_state(run)
            except ValueError:  # an unreadable results.json: run it again
                point["status"] = "failed"


def save(path: Path, sweep: dict[str, Any]) -> None:
    """Write ``sweep.json``, ``summary.csv`` and (with ``seed`` in the grid) ``seeds.csv`` into ``path``."""
    write_json(path / SWEEP_FILE, sweep)
    table = summary_table(path, sweep)
    table.to_csv(path / SUMMARY_FILE, index=False)
    if "seed" in sweep["grid"]:
        seed_table(table, [k for k in sweep["grid"] if k != "seed"]).to_csv(path / SEEDS_FILE, index=False)


def summary_table(path: Path, sweep: dict[str, Any]) -> pd.DataFrame:
    """Return one row per point: index, grid values, status, run folder and the scalars its notebook recorded."""
    rows = []
    for point in sweep["points"]:
        row: dict[str, Any] = {"point": point["index"], **point["grid"], "status": point["status"]}
        row["run"] = point.get("run") or ""
        results = _results(path / point["run"]) if point.get("run") else {}
        for key, value in results.items():
            if key not in _NOT_NUMBERS and key not in row and isinstance(value, (int, float, str, bool)):
                row[key] = value
        rows.append(row)
    return pd.DataFrame(rows)


def _results(run: Path) -> dict[str, Any]:
    try:
        return read_json(run / RESULTS_FILE)
    except ValueError:
        return {}


def seed_table(summary: pd.DataFrame, others: list[str]) -> pd.DataFrame:
    """Return per point of the ``others`` grid keys and per recorded number its IQM over seeds with interval."""
    from rlq.stats import estimate

    done = summary[summary["status"] == "ok"]
    skip = {"point", "seed", "status", "run", "run_seconds", "train_seconds", *others}
    numbers = [
        c for c in done.columns if c not in skip and pd.api.types.is_numeric_dtype(done[c])
        and not pd.api.types.is_bool_dtype(done[c])
    ]  # fmt: skip
    rows = []
    groups = done.groupby(others, sort=False, dropna=False) if others else [((), done)]
    for values, group in groups:
        values = values if isinstance(values, tuple) else (values,)
        for column in numbers:
            scores = group[column].dropna().to_numpy(dtype=float)
            scores = scores[[math.isfinite(s) for s in scores]]
            if not len(scores):
                continue
            e = estimate(scores)
            rows.append(
                {**dict(zip(others, values, strict=True)), "metric": column, "iqm": e.value, "lower": e.lower,
                 "upper": e.upper, "n": e.n, "mean": scores.mean(), "std": scores.std(ddof=1) if len(scores) > 1 else 0.0}
            )  # fmt: skip
    return pd.DataFrame(rows, columns=[*others, "metric", "iqm", "lower", "upper", "n", "mean", "std"])


def sweep_points(runs_dir: str | Path) -> list[Path]:
    """Return the run folders of every sweep point under ``runs_dir`` (``sweeps/<experiment>/<sweep>/...``)."""
    found = []
    for sweep in sorted(Path(runs_dir).glob(f"{SWEEPS_FOLDER}/*/*/{SWEEP_FILE}")):
        found += sorted(p.parent for p in sweep.parent.glob(f"*/*/{RESULTS_FILE}"))
    return found
