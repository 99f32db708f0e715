"""A notebook's runs in its run folder: its per-run function over its jobs, saved, resumed, and stacked into tables.

A notebook defines the function that trains one run (``train_one(env_id, seed, method)``) and hands it, with
its jobs, to :func:`run_notebook_jobs`; seeds, workers, resume and progress stay behind that one call::

    jobs = [dict(env_id=e, seed=s, method=m) for e in env_ids for s in seeds for m in methods]
    results = run_notebook_jobs(train_one, jobs, out, workers=workers, executor=executor, progress=print)
    tables = stack_tables(results, out)  # summary, history, curve, events; also out/<table>.csv

Each job is a dict of plain values (the function's keyword arguments) and names its run: the result is
saved under it in ``out/jobs/`` as it arrives, and a resumed run (``rlq run --resume``, or ``--reuse``'s
runs) loads it instead of training again. The run folder's parameters are fixed for its lifetime, so a
saved result stands for its job: in JupyterLab, a parameter changed since the kernel made its run folder
is refused in one line (:func:`rlq.experiments.run_folders.check_parameters_unchanged`) until ``run_dir()``
makes a new one.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from rlq.core.jsonio import read_json, write_json
from rlq.experiments.run_folders import RESULTS_FILE, check_parameters_unchanged
from rlq.rl.parallel import JOBS_FOLDER, Executor, JobFailure, JobsFailed, run_jobs

RUN_TABLES = ("summary", "history", "curve", "events")
"""The tables of a compressed run (:func:`rlq.sb3.run_record.compression_record`) gathered over runs and
written as CSV (``layers`` stays per run)."""


def run_notebook_jobs(
    func: Callable[..., Any],
    jobs: Sequence[dict[str, Any]],
    out: str | Path,
    *,
    workers: int = 1,
    executor: str = "processes",
    ray_address: str | None = None,
    progress: Callable[[str], Any] | None = None,
) -> list[Any]:
    """Return ``[func(**job) for job in jobs]``, run ``workers`` at a time in processes or on Ray.

    ``executor`` and ``ray_address`` (empty: a local Ray) are :class:`rlq.rl.parallel.Executor`'s ``kind`` and
    ``address``. Each result is saved in ``out/jobs/`` under its job, and one saved there already is loaded
    instead of run. A failed job does not stop the others: once they are done, ``out/results.json`` lists the failed ones under
    ``failed_jobs`` and :class:`rlq.rl.parallel.JobsFailed` is raised, so ``rlq run --resume`` trains only
    those. Raises :class:`rlq.experiments.run_folders.ParametersChanged` before any job when this kernel
    changed a parameter since it made ``out``. ``progress`` (``print`` in a notebook) gets one line per finished run (:func:`run_line`).
    """
    check_parameters_unchanged(out)
    labels = [keys_label(job) or f"job {i + 1}" for i, job in enumerate(jobs)]

    def finished(index: int, result: Any) -> None:
        if progress is not None:
            progress(run_line(labels[index], result))

    outcome = run_jobs(
        func, jobs, workers=workers, on_result=finished, labels=labels,
        executor=Executor(executor, address=ray_address or None), store=Path(out) / JOBS_FOLDER, on_error="keep",
    )  # fmt: skip
    record_failed_jobs(out, outcome.failures)
    if outcome.failures:
        raise JobsFailed(outcome.failures, len(jobs))
    return list(outcome)


def stack_tables(
    results: Sequence[dict[str, Any]], out: str | Path | None = None, tables: Sequence[str] = RUN_TABLES
) -> dict[str, pd.DataFrame]:
    """Return the runs' ``tables`` stacked: ``summary`` one row per run, the others every run's rows.

    With ``out``, each is also written to ``out/<name>.csv``: a run folder's top-level CSVs are what ``rlq
    publish`` commits.
    """
    stacked = {
        name: pd.DataFrame([r["summary"] for r in results])
        if name == "summary"
        else _stack([r[name] for r in results])
        for name in tables
    }
    if out is not None:
        for name, table in stacked.items():
            table.to_csv(Path(out) / f"{name}.csv", index=False)
    return stacked


def _stack(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Return ``frames`` stacked as pandas 2 does now: a dense run's empty event table and all-NA columns (its
    block size) take no part in the dtypes, so the committed CSVs keep their formats (pandas warns that a later
    version will change this; the warning is for us, not for a notebook's reader)."""
    if not frames:
        return pd.DataFrame()
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="The behavior of DataFrame concatenation", category=FutureWarning
        )
        return pd.concat(frames, ignore_index=True)


def record_failed_jobs(out: str | Path, failures: Sequence[JobFailure]) -> None:
    """Write the failed runs (label, keys, error) into ``out/results.json`` as ``failed_jobs`` (none: ``[]``).

    Written when runs failed, or to clear an earlier attempt's list; the rest of results.json is kept.
    """
    path = Path(out) / RESULTS_FILE
    results = read_json(path) if path.is_file() else {}
    if failures or "failed_jobs" in results:
        results["failed_jobs"] = [f.as_dict() for f in failures]
        write_json(path, results)


def run_line(label: str, result: Any) -> str:
    """Return one finished run as a line: its label, and its compression, returns and time when it has a summary."""
    row = result.get("summary") if isinstance(result, dict) else None
    if not isinstance(row, dict) or "avg_compression_ratio" not in row:
        return f"{label}: done"
    parts = [f"average compression {row['avg_compression_ratio']:.3f}"]
    if "eval_return" in row:
        parts.append(f"evaluation return {row['eval_return']:.2f}")
    parts.append(f"last training episodes {row['final_train_return']:.2f}")
    parts.append(f"{row['wall_time_s']:.0f} s")
    if row.get("resumed_from"):
        parts.append(f"resumed from step {row['resumed_from']}")
    return f"{label}: " + ", ".join(parts)


def keys_label(keys: dict[str, Any]) -> str:
    """Return a run's keys as its name in progress lines and bars, e.g. ``"env_id Pendulum-v1, seed 0, method gst"``."""
    return ", ".join(f"{k} {v}" for k, v in keys.items() if v is not None)
