"""rlq.rl.parallel.run_jobs: results in job order, in this process, in spawned workers or on Ray; a failing job
does not stop the others; results saved per job and loaded instead of rerun."""

from __future__ import annotations

import os

import pytest

from rlq.rl.parallel import Executor, ResultStore, run_jobs


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


def test_a_failing_job_raises_its_error_after_the_others_finished(tmp_path):
    seen = []
    with pytest.raises(ZeroDivisionError) as raised:
        run_jobs(
            divmod_job, [{"a": 1, "b": 0}, {"a": 7, "b": 2}, {"a": 9, "b": 4}], workers=2,
            on_result=lambda i, r: seen.append(i),
        )  # fmt: skip
    assert sorted(seen) == [1, 2] and "1 of 3 jobs failed: job 1: ZeroDivisionError" in str(
        raised.value.__notes__
    )
    with pytest.raises(ZeroDivisionError):
        run_jobs(divmod_job, [{"a": 1, "b": 0}])


@pytest.mark.parametrize("workers", [1, 2])
def test_keep_going_returns_none_for_failed_jobs_and_lists_them_with_their_keys(workers):
    jobs = [{"a": 1, "b": 0, "keys": {"seed": 0}}, {"a": 7, "b": 2, "keys": {"seed": 1}}]
    results = run_jobs(keyed_divmod, jobs, workers=workers, on_error="keep", labels=["s0", "s1"])
    assert list(results) == [None, (3, 1)]
    (failure,) = results.failures
    assert failure.index == 0 and failure.keys == {"seed": 0} and failure.label == "s0"
    assert failure.error == "ZeroDivisionError: integer division or modulo by zero"
    assert "ZeroDivisionError" in failure.traceback
    assert failure.as_dict() == {"label": "s0", "keys": {"seed": 0}, "error": failure.error}


@pytest.mark.parametrize("workers", [1, 2])
def test_saved_results_are_loaded_and_only_the_jobs_without_one_run_again(tmp_path, workers):
    calls = tmp_path / "calls"
    calls.mkdir()
    jobs = [{"a": n, "b": 3 - n, "keys": {"n": n}, "calls": str(calls)} for n in range(4)]  # n=3 fails
    first = run_jobs(counted_divmod, jobs, workers=workers, store=tmp_path / "jobs", on_error="keep")
    assert [f.keys for f in first.failures] == [{"n": 3}] and len(list(calls.iterdir())) == 4
    assert len(list((tmp_path / "jobs").glob("*.json"))) == 3  # one file per finished job
    jobs[3]["b"] = 1  # "fixed": the resumed run succeeds
    seen = []
    second = run_jobs(
        counted_divmod, jobs, workers=workers, store=tmp_path / "jobs", on_result=lambda i, r: seen.append(i)
    )
    assert list(second) == [divmod(n, 3 - n) if n < 3 else (3, 0) for n in range(4)]
    assert second.loaded == [0, 1, 2] and sorted(seen) == [0, 1, 2, 3]
    assert sorted(p.name for p in calls.iterdir()) == [
        "0-1",
        "1-1",
        "2-1",
        "3-1",
        "3-2",
    ]  # only n=3 ran again
    third = run_jobs(counted_divmod, jobs, store=tmp_path / "jobs")
    assert third == second and third.loaded == [0, 1, 2, 3]


def test_a_saved_result_that_no_longer_stands_for_its_job_runs_again(tmp_path):
    calls = tmp_path / "calls"
    calls.mkdir()
    jobs = [{"a": 7, "b": b, "keys": {"n": n}, "calls": str(calls)} for n, b in enumerate((2, 3))]
    run_jobs(counted_divmod, jobs, store=tmp_path / "jobs")
    jobs[1]["b"] = 4  # same keys, another job: the caller says its saved result no longer stands
    again = run_jobs(
        counted_divmod,
        jobs,
        store=ResultStore(tmp_path / "jobs", keep=lambda job, saved: saved == divmod(7, job["b"])),
    )
    assert list(again) == [(3, 1), (1, 3)] and again.loaded == [0]
    assert sorted(p.name for p in calls.iterdir()) == ["0-1", "1-1", "1-2"]
    assert run_jobs(counted_divmod, jobs, store=tmp_path / "jobs").loaded == [0, 1]  # the new result is saved


def test_a_damaged_saved_result_runs_again(tmp_path):
    store = ResultStore(tmp_path)
    path = store.save({"seed": 0}, 42)
    assert store.load({"seed": 0}) == (True, 42) and store.load({"seed": 1}) == (False, None)
    path.write_bytes(b"not JSON")
    assert store.load({"seed": 0}) == (False, None)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"executor": "threads"}, "executor must be one of processes|ray"),
        ({"on_error": "ignore"}, "on_error must be"),
    ],
)
def test_bad_options_name_the_problem(kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_jobs(divmod_job, [{"a": 1, "b": 1}], **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kind": "threads"}, "executor must be one of processes|ray"),
        ({"kind": "ray", "resources": {"gpus": 1}}, "unknown key"),
        ({"kind": "ray", "resources": {"num_cpus": -1}}, "num_cpus"),
        ({"resources": {"num_gpus": True}}, "num_gpus"),
    ],
)
def test_a_bad_executor_names_the_problem(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Executor(**kwargs)


def test_run_jobs_takes_an_executor_or_its_kind_and_a_store_or_its_folder(tmp_path):
    assert Executor("ray", "auto").resources == {"num_cpus": 1, "num_gpus": 0}
    jobs = [{"a": 7, "b": 2}, {"a": 9, "b": 4}]
    by_kind = run_jobs(divmod_job, jobs, executor="processes", store=tmp_path / "jobs")
    assert by_kind == [(3, 1), (2, 1)] and by_kind.loaded == []
    loaded = run_jobs(divmod_job, jobs, executor=Executor("processes"), store=tmp_path / "jobs")
    assert loaded == by_kind and loaded.loaded == [0, 1]
    kept = run_jobs(
        divmod_job,
        jobs,
        executor=Executor(),
        store=ResultStore(tmp_path / "jobs", keep=lambda job, _: job["a"] == 7),
    )
    assert kept == by_kind and kept.loaded == [0]


def test_results_say_how_many_jobs_ran_side_by_side(tmp_path, monkeypatch):
    from rlq.core.progress import PROGRESS_FILE_ENV, ProgressReader

    monkeypatch.setenv(PROGRESS_FILE_ENV, str(tmp_path / "progress.jsonl"))
    assert run_jobs(divmod_job, [{"a": 7, "b": 2}], workers=10_000).workers == 1
    assert run_jobs(divmod_job, [], workers=4).workers == 0
    events = ProgressReader(tmp_path / "progress.jsonl", from_end=False).read()
    assert [e["workers"] for e in events if e["event"] == "jobs"] == [1]


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_bad_workers_name_the_problem(workers):
    with pytest.raises(ValueError, match="workers must be a positive int"):
        run_jobs(divmod_job, [], workers=workers)


def test_workers_run_a_function_made_at_run_time_as_a_notebook_cell_makes_one():
    """A closure (as a function defined in a notebook or in ``__main__``) cannot be pickled by reference, so
    worker processes get it by value, and the job's own function-valued arguments with it."""
    import pickle
    import threading

    offset = 100  # a local the closure carries into the workers

    def shifted_divmod(a: int, b: int, then=lambda q: q) -> tuple[int, tuple[int, int]]:
        import os as _os

        quotient, remainder = divmod(a + offset, b)
        return _os.getpid(), (then(quotient), remainder)

    with pytest.raises((pickle.PicklingError, AttributeError)):  # what plain pickle makes of it
        pickle.dumps(shifted_divmod)
    jobs = [{"a": n, "b": 7} for n in range(3)] + [{"a": 3, "b": 7, "then": lambda q: -q}]
    results = run_jobs(shifted_divmod, jobs, workers=2)
    assert [r[1] for r in results] == [divmod(n + 100, 7) for n in range(3)] + [(-14, 5)]
    assert results.workers == 2 and all(pid != os.getpid() for pid, _ in results)
    # a job that cannot be sent at all (a lock) fails alone, named by its error; the others still run
    kept = run_jobs(shifted_divmod, [{"a": 1, "b": 7}, {"a": 2, "b": 7, "then": threading.Lock()}], workers=2,
                    on_error="keep")  # fmt: skip
    assert kept[0][1] == (14, 3) and kept[1] is None
    assert [f.index for f in kept.failures] == [1] and "lock" in kept.failures[0].error


def divmod_job(a: int, b: int) -> tuple[int, int]:
    return divmod(a, b)


def pid_and_divmod(a: int, b: int) -> tuple[int, tuple[int, int]]:
    return os.getpid(), divmod(a, b)


def keyed_divmod(a: int, b: int, keys: dict) -> tuple[int, int]:
    return divmod(a, b)


def counted_divmod(a: int, b: int, keys: dict, calls: str) -> tuple[int, int]:
    """divmod, leaving a file ``<n>-<call count>`` in ``calls`` for every call."""
    n = 1
    while os.path.exists(os.path.join(calls, f"{keys['n']}-{n}")):
        n += 1
    open(os.path.join(calls, f"{keys['n']}-{n}"), "w").close()
    return divmod(a, b)


def test_worker_processes_report_each_job_into_the_run_s_progress_file(tmp_path, monkeypatch):
    from rlq.core.progress import PROGRESS_FILE_ENV, ProgressReader

    events_file = tmp_path / "progress.jsonl"
    monkeypatch.setenv(PROGRESS_FILE_ENV, str(events_file))
    jobs = [{"a": n, "b": 3 - n} for n in range(4)]  # the last divides by zero
    with pytest.raises(ZeroDivisionError):
        run_jobs(pid_and_divmod, jobs, workers=2, labels=["a", "b", "c", "d"])  # the others still finish
    events = ProgressReader(events_file, from_end=False).read()
    assert events[0]["event"] == "jobs" and events[0]["labels"] == ["a", "b", "c", "d"]
    ends = {e["id"]: e for e in events if e["event"] == "job_end"}
    starts = [e for e in events if e["event"] == "job_start"]
    assert starts and all(e["pid"] != os.getpid() for e in starts)  # written by the workers themselves
    failed = ends[events[0]["ids"][3]]
    assert failed["status"] == "failed" and failed["error"].startswith("ZeroDivisionError")
    assert [ends[i]["status"] for i in events[0]["ids"]] == ["ok", "ok", "ok", "failed"]


# --------------------------------------------------------------------------------------------------------
# executor="ray": one local Ray instance of 2 CPUs for this module (Ray's start-up costs 12-15 s here)


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray of 2 CPUs, started before the tests (run_jobs must use it and leave it running)."""
    ray = pytest.importorskip("ray")
    from rlq.rl.parallel import ray_init_kwargs, start_ray

    assert not ray.is_initialized()
    # the jobs below are functions of this test module: Ray's workers import it from this folder
    tests = os.path.dirname(os.path.abspath(__file__))
    start_ray(
        {**ray_init_kwargs(2, {"num_cpus": 1}, None), "runtime_env": {"env_vars": {"PYTHONPATH": tests}}}
    )
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_returns_what_processes_return_and_reports_each_job(local_ray, tmp_path, monkeypatch):
    from rlq.core.progress import PROGRESS_FILE_ENV, ProgressReader

    events_file = tmp_path / "progress.jsonl"
    monkeypatch.setenv(PROGRESS_FILE_ENV, str(events_file))  # set after Ray started: tasks get it anyway
    jobs = [{"a": n, "b": 3} for n in range(5)]
    on_ray = run_jobs(
        pid_and_divmod, jobs, workers=2, executor=Executor("ray", resources={"num_cpus": 1, "num_gpus": 0})
    )
    assert (
        [r[1] for r in on_ray]
        == [r[1] for r in run_jobs(pid_and_divmod, jobs)]
        == [divmod(n, 3) for n in range(5)]
    )
    assert all(pid != os.getpid() for pid, _ in on_ray) and local_ray.is_initialized()
    events = ProgressReader(events_file, from_end=False).read()
    ray_ids = events[0]["ids"]
    starts = [e for e in events if e["event"] == "job_start" and e["id"] in ray_ids]
    ends = [e for e in events if e["event"] == "job_end" and e["id"] in ray_ids]
    assert len(starts) == 5 and all(e["pid"] != os.getpid() for e in starts)  # written by the Ray workers
    assert sorted(e["id"] for e in ends) == sorted(ray_ids) and {e["status"] for e in ends} == {"ok"}


@pytest.mark.slow
def test_ray_keeps_the_others_when_a_job_fails_and_a_resume_runs_only_the_missing(local_ray, tmp_path):
    calls = tmp_path / "calls"
    calls.mkdir()
    jobs = [{"a": n, "b": 3 - n, "keys": {"n": n}, "calls": str(calls)} for n in range(4)]  # n=3 fails
    first = run_jobs(
        counted_divmod, jobs, workers=2, executor="ray", store=tmp_path / "jobs", on_error="keep"
    )
    assert list(first) == [(0, 0), (0, 1), (2, 0), None]
    (failure,) = first.failures
    assert failure.keys == {"n": 3} and failure.error.startswith("ZeroDivisionError")
    jobs[3]["b"] = 1
    second = run_jobs(counted_divmod, jobs, workers=2, executor="ray", store=tmp_path / "jobs")
    assert second[3] == (3, 0) and second.loaded == [0, 1, 2]
    assert sorted(p.name for p in calls.iterdir()) == ["0-1", "1-1", "2-1", "3-1", "3-2"]
    with pytest.raises(ZeroDivisionError):  # the job's own error type, as with processes
        run_jobs(divmod_job, [{"a": 1, "b": 0}, {"a": 1, "b": 1}], executor="ray", workers=2)
    (array,) = run_jobs(np_ones, [{"n": 3}], executor="ray")
    array += 1  # results from the object store come back writable
    assert array.tolist() == [2.0, 2.0, 2.0]


def np_ones(n: int):
    import numpy as np

    return np.ones(n)


# --------------------------------------------------------------------------------------------------------
# rlq run --resume: a notebook whose jobs save into <run folder>/jobs/ retries only the job that failed


@pytest.mark.slow
def test_rlq_run_resume_runs_only_the_jobs_without_a_saved_result(tmp_path):
    import json
    import subprocess
    import sys

    import nbformat

    folder = tmp_path / "notebooks"
    folder.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Jobs: three jobs, the last fails until a file exists"),
        nbformat.v4.new_code_cell(
            "n = 3  # jobs [min: 1]\nworkers = 1  # side by side [min: 1]", metadata={"tags": ["parameters"]}
        ),
        nbformat.v4.new_code_cell(
            "import rlq\n"
            "from rlq.experiments.run_folders import run_dir\n"
            "from rlq.rl.parallel import run_jobs\n"
            "from test_parallel import fails_without_file\n"
            "out = run_dir()\n"
            "jobs = [{'i': i, 'keys': {'i': i}, 'out': str(out)} for i in range(n)]\n"
            "results = run_jobs(fails_without_file, jobs, workers, store=out / 'jobs', on_error='keep')\n"
            "rlq.record(failed=len(results.failures), loaded=len(results.loaded))\n"
            "assert not results.failures"
        ),
    ]
    nbformat.write(nb, folder / "jobs.ipynb")
    env = {
        **os.environ,
        "RLQ_NOTEBOOKS": str(folder),
        # this folder for the job function, then the rlq this test imports (the kernel imports the same)
        "PYTHONPATH": os.pathsep.join(
            [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")]
        ),
    }
    cli = [sys.executable, "-m", "rlq.faces.cli", "run"]
    first = subprocess.run(
        [*cli, "jobs", "-p", "workers", "10000", "--out", str(tmp_path / "out"), "--quiet"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert first.returncode == 1, first.stderr
    run = first.stdout.strip().splitlines()[-1]
    results = json.loads(open(os.path.join(run, "results.json")).read())
    assert results["status"] == "failed" and results["failed"] == 1
    # the workers asked for stay in params.json; results.json says how many ran: one per job, 3
    assert json.loads(open(os.path.join(run, "params.json")).read())["workers"] == 10000
    assert results["workers_used"] == 3
    open(os.path.join(run, "fixed"), "w").close()
    again = subprocess.run([*cli, "--resume", run, "--quiet"], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    results = json.loads(open(os.path.join(run, "results.json")).read())
    assert results["failed"] == 0 and results["loaded"] == 2
    assert results["workers_used"] == 1  # the one job left ran in the kernel
    assert sorted(os.listdir(os.path.join(run, "calls"))) == ["0-1", "1-1", "2-1", "2-2"]


def fails_without_file(i: int, keys: dict, out: str) -> int:
    """Leave ``calls/<i>-<n>`` for the n-th call; the last job (i=2) fails until ``out/fixed`` exists."""
    calls = os.path.join(out, "calls")
    os.makedirs(calls, exist_ok=True)
    n = 1
    while os.path.exists(os.path.join(calls, f"{i}-{n}")):
        n += 1
    open(os.path.join(calls, f"{i}-{n}"), "w").close()
    if i == 2 and not os.path.exists(os.path.join(out, "fixed")):
        raise RuntimeError("not fixed yet")
    return i


_ORPHAN_SCRIPT = """
import os, sys, time
from pathlib import Path
from rlq.rl.parallel import run_jobs

def sleeper(folder, i):
    (Path(folder) / f"worker_{i}.pid").write_text(str(os.getpid()))
    time.sleep(120)
    return i

if __name__ == "__main__":
    run_jobs(sleeper, [{"folder": sys.argv[1], "i": i} for i in range(2)], workers=2)
"""


def test_worker_processes_exit_when_their_parent_is_killed(tmp_path):
    """A SIGKILLed parent leaves no worker training on (a --resume would train beside it)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = tmp_path / "orphans.py"
    script.write_text(_ORPHAN_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("worker_*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = [int(p.read_text()) for p in tmp_path.glob("worker_*.pid")]
        assert len(pids) == 2, "the workers never started"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

        def alive(pid: int) -> bool:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().split()[2]
            except FileNotFoundError:
                return False
            return state != "Z"

        deadline = time.monotonic() + 15
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in pids if alive(pid)], "worker processes outlived their killed parent"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in tmp_path.glob("worker_*.pid"):
            try:
                os.kill(int(p.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
