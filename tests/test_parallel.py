"""rlq.rl.parallel.run_jobs: results in job order, in this process or in spawned workers, errors propagate."""

from __future__ import annotations

import os

import pytest

from rlq.rl.parallel import run_jobs


def test_in_process_results_follow_job_order_and_report_each():
    seen = []
    results = run_jobs(
        divmod_job, [{"a": 7, "b": 2}, {"a": 9, "b": 4}], on_result=lambda i, r: seen.append((i, r))
    )
    assert results == [(3, 1), (2, 1)] and seen == [(0, (3, 1)), (1, (2, 1))]


def test_workers_run_in_other_processes_and_keep_job_order():
    jobs = [{"a": n, "b": 3} for n in range(5)]
    results = run_jobs(pid_and_divmod, jobs, workers=2)
    assert [r[1] for r in results] == [divmod(n, 3) for n in range(5)]
    assert all(pid != os.getpid() for pid, _ in results)


def test_a_failing_job_raises_its_error():
    with pytest.raises(ZeroDivisionError):
        run_jobs(divmod_job, [{"a": 1, "b": 1}, {"a": 1, "b": 0}], workers=2)
    with pytest.raises(ZeroDivisionError):
        run_jobs(divmod_job, [{"a": 1, "b": 0}])


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_bad_workers_name_the_problem(workers):
    with pytest.raises(ValueError, match="workers must be a positive int"):
        run_jobs(divmod_job, [], workers=workers)


def divmod_job(a: int, b: int) -> tuple[int, int]:
    return divmod(a, b)


def pid_and_divmod(a: int, b: int) -> tuple[int, tuple[int, int]]:
    return os.getpid(), divmod(a, b)


def test_worker_processes_report_each_job_into_the_run_s_progress_file(tmp_path, monkeypatch):
    from rlq.core.progress import PROGRESS_FILE_ENV, ProgressReader

    events_file = tmp_path / "progress.jsonl"
    monkeypatch.setenv(PROGRESS_FILE_ENV, str(events_file))
    jobs = [{"a": n, "b": 3 - n} for n in range(4)]  # the last divides by zero
    with pytest.raises(ZeroDivisionError):
        run_jobs(pid_and_divmod, jobs, workers=2, labels=["a", "b", "c", "d"])
    events = ProgressReader(events_file, from_end=False).read()
    assert events[0]["event"] == "jobs" and events[0]["labels"] == ["a", "b", "c", "d"]
    ends = {e["id"]: e for e in events if e["event"] == "job_end"}
    starts = [e for e in events if e["event"] == "job_start"]
    assert starts and all(e["pid"] != os.getpid() for e in starts)  # written by the workers themselves
    failed = ends[events[0]["ids"][3]]
    assert failed["status"] == "failed" and failed["error"].startswith("ZeroDivisionError")
    assert {e["status"] for e in ends.values()} <= {"ok", "failed", "cancelled"}
