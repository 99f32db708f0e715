"""Run independent jobs (one training run per seed and method) in worker processes.

Notebooks list their runs as jobs (keyword dicts for one top-level function) and call
:func:`run_jobs`: ``workers=1`` runs them one after another in this process (what tests and 2-core
machines use for predictability); ``workers > 1`` starts that many fresh processes (``spawn``: no forked
PyTorch thread pools) and returns the results in job order, so a machine with more cores trains seeds and
methods side by side. Each job must set its own thread count (``torch_threads``) and write into its own
folder; functions and results must be picklable.

Every job reports its start and end as progress events (:mod:`rlq.core.progress`), and the trainings inside
it report under the job, so ``rlq run`` and JupyterLab show which jobs are done, running or failed, with a
bar per running job.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

from rlq.core import progress
from rlq.core.validation import check_positive_int

T = TypeVar("T")

POLL_SECONDS = 0.5
"""Seconds between two looks at the workers' progress while waiting for them."""


def run_jobs(
    func: Callable[..., T],
    jobs: Sequence[dict[str, Any]],
    workers: int = 1,
    on_result: Callable[[int, T], None] | None = None,
    labels: Sequence[str] | None = None,
) -> list[T]:
    """Return ``[func(**job) for job in jobs]``, computed by ``workers`` processes (1: in this process).

    ``on_result(index, result)`` is called as each job finishes (in completion order), e.g. to print a
    line of progress. The first job that raises stops the pool (pending jobs are cancelled) and its
    exception propagates. ``labels`` name the jobs in progress bars and lines (default ``job 1``, ...).
    """
    workers = check_positive_int("workers", workers)
    if not callable(func):
        raise TypeError(f"func must be callable, got {func!r}")
    jobs = [dict(job) for job in jobs]
    labels = [str(label) for label in labels] if labels is not None else []
    if labels and len(labels) != len(jobs):
        raise ValueError(f"{len(labels)} labels for {len(jobs)} jobs")
    labels = labels or [f"job {i + 1}" for i in range(len(jobs))]
    batch = progress.new_id()
    ids = [f"{batch}.{i}" for i in range(len(jobs))]
    if jobs:
        progress.emit("jobs", ids=ids, labels=labels)
    results: list[Any] = [None] * len(jobs)
    if workers == 1 or len(jobs) <= 1:
        for index, job in enumerate(jobs):
            results[index] = run_job(func, ids[index], labels[index], job)
            if on_result is not None:
                on_result(index, results[index])
        return results
    context = multiprocessing.get_context("spawn")
    with (
        progress.relay_to_this_process() as poll,
        ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool,
    ):
        futures = {pool.submit(run_job, func, ids[i], labels[i], job): i for i, job in enumerate(jobs)}
        try:
            pending: set[Future] = set(futures)
            while pending:
                done, pending = wait(pending, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
                poll()
                for future in done:
                    index = futures[future]
                    results[index] = future.result()
                    if on_result is not None:
                        on_result(index, results[index])
        except BaseException:
            for future, index in futures.items():
                if future.cancel():
                    progress.emit("job_end", id=ids[index], status="cancelled")
            raise
    return results


def run_job(func: Callable[..., T], job_id: str, label: str, job: dict[str, Any]) -> T:
    """Return ``func(**job)``, reported as job ``job_id`` (start, end, failure) in progress events."""
    with progress.job(job_id, label):
        return func(**job)
