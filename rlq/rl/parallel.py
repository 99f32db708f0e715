"""Run independent jobs (one training run per seed and method) in worker processes.

Notebooks list their runs as jobs (keyword dicts for one top-level function) and call
:func:`run_jobs`: ``workers=1`` runs them one after another in this process (what tests and 2-core
machines use for predictability); ``workers > 1`` starts that many fresh processes (``spawn``: no forked
PyTorch thread pools) and returns the results in job order, so a machine with more cores trains seeds and
methods side by side. Each job must set its own thread count (``torch_threads``) and write into its own
folder; functions and results must be picklable.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

from rlq.core.validation import check_positive_int

T = TypeVar("T")


def run_jobs(
    func: Callable[..., T],
    jobs: Sequence[dict[str, Any]],
    workers: int = 1,
    on_result: Callable[[int, T], None] | None = None,
) -> list[T]:
    """Return ``[func(**job) for job in jobs]``, computed by ``workers`` processes (1: in this process).

    ``on_result(index, result)`` is called as each job finishes (in completion order), e.g. to print a
    line of progress. The first job that raises stops the pool (pending jobs are cancelled) and its
    exception propagates.
    """
    workers = check_positive_int("workers", workers)
    if not callable(func):
        raise TypeError(f"func must be callable, got {func!r}")
    jobs = [dict(job) for job in jobs]
    results: list[Any] = [None] * len(jobs)
    if workers == 1 or len(jobs) <= 1:
        for index, job in enumerate(jobs):
            results[index] = func(**job)
            if on_result is not None:
                on_result(index, results[index])
        return results
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
        futures = {pool.submit(func, **job): index for index, job in enumerate(jobs)}
        try:
            for future in as_completed(futures):
                index = futures[future]
                results[index] = future.result()
                if on_result is not None:
                    on_result(index, results[index])
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return results
