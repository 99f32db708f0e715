"""Run independent jobs (one training run per seed and method) in worker processes or on a Ray cluster.

Notebooks list their runs as jobs (keyword dicts for one top-level function) and call :func:`run_jobs`:

- ``executor="processes"`` (the default): ``workers=1`` runs the jobs one after another in this process
  (what tests and 2-core machines use for predictability); ``workers > 1`` starts that many fresh processes
  (``spawn``: no forked PyTorch thread pools).
- ``executor="ray"``: each job is a Ray task, at most ``workers`` at a time. ``executor=Executor("ray",
  address, resources)`` says more: each task asks for ``resources`` (default one CPU), and Ray joins the
  cluster at ``address`` (``"auto"``: the one ``ray start`` started on this machine) or, without one, starts
  a local instance of ``workers`` CPUs; Ray started here is shut down at the end, a Ray already running in
  this process is used and left running.

Results come back to this process (through Ray's object store on a cluster) and are returned in job order.
With ``store`` (a run folder's ``jobs/``), each result is also saved there as it arrives, keyed by the job's
``keys``; a later call with the same store loads the saved results and runs only the other jobs, which is
how ``rlq run --resume`` retrains only what is missing. A :class:`ResultStore` made with ``keep(job, result)``
lets that decide whether a saved result still stands for a job (a caller compares the settings the result
was built with): one that does not is run again. Jobs themselves write their checkpoints into the
folders they are given: resuming a job part-way needs those folders on a file system every worker shares,
while finished results need nothing shared.

A job that raises does not stop the others. ``on_error="raise"`` (default) re-raises the first failure
once every job has ended (the others' results are saved by then); ``on_error="keep"`` returns ``None`` in
its place and lists it in the returned :class:`JobResults`' ``failures``.

Each job must set its own thread count (``torch_threads``) and write into its own folder. Worker processes
get the function and its job by value (cloudpickle), so a function defined in a notebook, in ``__main__`` or
inside another function runs there too; results must be picklable. Every job reports its start and end as
progress events (:mod:`rlq.core.progress`), Ray tasks included, so ``rlq run`` and JupyterLab show a bar
over the jobs (finished, failed, running) and a bar per running training.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import pickle
import re
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import cloudpickle

from rlq.core import progress
from rlq.core.plain_data import read_data, write_data
from rlq.core.validation import check_positive_int

T = TypeVar("T")

POLL_SECONDS = 0.5
"""Seconds between two looks at the workers' progress while waiting for them."""
EXECUTORS = ("processes", "ray")
"""Where :func:`run_jobs` runs jobs."""
JOBS_FOLDER = "jobs"
"""The folder of a run folder that holds each finished job's result (:class:`ResultStore`)."""
ENV_PREFIX = "RLQ_"
"""Environment variables of this process that Ray tasks get too (progress file, run folder, notebooks)."""


@dataclass(frozen=True)
class Executor:
    """Where :func:`run_jobs` runs jobs: ``kind`` is ``"processes"`` or ``"ray"``.

    For Ray, ``address`` is the cluster to join (None: start a local Ray; ``"auto"``: the one ``ray start``
    started on this machine) and ``resources`` what each task asks for (``num_cpus``, ``num_gpus``,
    ``memory``, ``resources``; default ``{"num_cpus": 1, "num_gpus": 0}``). Both are ignored by processes.
    An unknown kind or bad resources raise ValueError here; ``resources`` holds the checked dict, with
    ``num_cpus`` and ``num_gpus`` filled in.
    """

    kind: str = "processes"
    address: str | None = None
    resources: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise ValueError(f"executor must be one of {'|'.join(EXECUTORS)}, got {self.kind!r}")
        object.__setattr__(self, "resources", _check_resources(self.resources))


@dataclass
class JobFailure:
    """A job that raised: its position, label, ``keys`` and error (``"Type: message"``) with traceback."""

    index: int
    label: str
    keys: dict[str, Any]
    error: str
    traceback: str = ""

    def as_dict(self) -> dict[str, Any]:
        """Return the failure as a JSON-ready dict (label, keys, error), as results.json lists it."""
        return {"label": self.label, "keys": self.keys, "error": self.error}


class JobsFailed(RuntimeError):
    """Some jobs failed (``failures``) while the others finished: what a caller raises when it needs them all."""

    def __init__(self, failures: Sequence[JobFailure], total: int):
        self.failures = list(failures)
        lines = [f"{len(self.failures)} of {total} jobs failed (the others' results are kept):"]
        lines += [f"  {f.label}: {f.error}" for f in self.failures]
        if self.failures and self.failures[0].traceback:
            lines += [f"first failure ({self.failures[0].label}):", self.failures[0].traceback.rstrip()]
        super().__init__("\n".join(lines))


class JobResults(list):
    """The jobs' results in job order (``None`` for a failed job), with ``failures`` and ``loaded`` indices and
    ``workers``, how many jobs ran side by side at most (0 when every result was loaded)."""

    def __init__(
        self,
        results: Sequence[Any],
        failures: Sequence[JobFailure] = (),
        loaded: Sequence[int] = (),
        workers: int = 0,
    ):
        super().__init__(results)
        self.failures = list(failures)
        self.loaded = list(loaded)
        self.workers = workers


RESULT_FORMAT = "rlq job result"
"""What a job store file states it is (with :data:`RESULT_VERSION`), beside the job's key and its result."""
RESULT_VERSION = 1
PICKLED_FOLDER = "pickled"
"""Where :meth:`ResultStore.migrate_pickles` moves the pickles it converted, inside the store's folder."""


class PickledResults(ValueError):
    """A job store holds results saved as pickles (``*.pkl``): refused, as reading one can run code."""

    def __init__(self, folder: Path, pickles: Sequence[Path]):
        shown = ", ".join(p.name for p in pickles[:2]) + (", ..." if len(pickles) > 2 else "")
        super().__init__(
            f"{folder} holds {len(pickles)} job result(s) saved as pickles ({shown}), which can "
            f"run code when read: if you trust the run folder, convert them with `rlq migrate-jobs {folder.parent}` "
            f"(docs/runs.md); else move {folder} away, and its runs train again"
        )


class ResultStore:
    """Each finished job's result as one JSON file in ``folder``, named after and keyed by the job's keys.

    A job's key is its ``keys`` dict when it has one, else the job itself when every value of it is a
    plain number, string or None (a notebook's ``dict(env_id=..., seed=..., method=...)``), else its label. A result
    is data, written by :mod:`rlq.core.plain_data` (numbers, strings, lists, dicts, numpy arrays, tensors,
    DataFrames): reading a store never runs code. Results saved as pickles (``*.pkl``, the store's format before JSON) are
    refused (:class:`PickledResults`) until :meth:`migrate_pickles` converts them.

    ``keep(job, saved result)``, when given, must return True for :func:`run_jobs` to load a saved result,
    else the job runs again (and its new result replaces the saved one).
    """

    def __init__(self, folder: str | Path, keep: Callable[[dict[str, Any], Any], bool] | None = None):
        self.folder = Path(folder)
        self.keep = keep

    def stands(self, job: dict[str, Any], result: Any) -> bool:
        """Return whether a result saved for ``job`` is to be loaded (``keep``'s answer; True without ``keep``)."""
        return self.keep is None or bool(self.keep(job, result))

    @staticmethod
    def key(job: dict[str, Any], label: str) -> dict[str, Any]:
        """Return the key a job's result is saved under."""
        keys = job.get("keys")
        if isinstance(keys, dict) and keys:
            return dict(keys)
        if job and all(v is None or isinstance(v, (str, int, float)) for v in job.values()):
            return dict(job)
        return {"label": label}

    def path(self, key: dict[str, Any]) -> Path:
        """Return the file of the result saved under ``key``."""
        text = json.dumps(key, sort_keys=True, default=str)
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", "__".join(f"{k}-{v}" for k, v in key.items()))[:80]
        return self.folder / f"{slug}-{hashlib.sha1(text.encode()).hexdigest()[:10]}.json"

    def pickled(self) -> list[Path]:
        """Return the results in ``folder`` saved as pickles."""
        return sorted(self.folder.glob("*.pkl")) if self.folder.is_dir() else []

    def check_no_pickles(self) -> None:
        """Raise :class:`PickledResults` when ``folder`` holds pickled results."""
        pickles = self.pickled()
        if pickles:
            raise PickledResults(self.folder, pickles)

    def load(self, key: dict[str, Any]) -> tuple[bool, Any]:
        """Return ``(True, result)`` when a result is saved under ``key``, else ``(False, None)``.

        A damaged file counts as none (the job runs again); a pickled result raises :class:`PickledResults`.
        """
        path = self.path(key)
        if not path.is_file():
            self.check_no_pickles()  # its result may be among them, under a name of an earlier key scheme
            return False, None
        try:
            saved = read_data(path)
        except (OSError, ValueError):  # half written by hand, or unreadable: run the job again
            return False, None
        if not isinstance(saved, dict) or saved.get("key") != _plain_key(key):
            return False, None
        return True, saved.get("result")

    def saved(self) -> list[tuple[Path, dict[str, Any], Any]]:
        """Return ``(file, key, result)`` of every result in ``folder``; ValueError naming a damaged file."""
        self.check_no_pickles()
        found = []
        for path in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []:
            advice = f"move it out of {self.folder}, and its run trains again"
            try:
                saved = read_data(path)
            except ValueError as e:
                raise ValueError(f"{e}; {advice}") from None
            if not isinstance(saved, dict) or saved.get("format") != RESULT_FORMAT or "key" not in saved:
                raise ValueError(f"{path} is damaged: not a job result rlq wrote; {advice}")
            found.append((path, saved["key"], saved.get("result")))
        return found

    def save(self, key: dict[str, Any], result: Any) -> Path:
        """Return the file that now holds ``result`` under ``key`` (written whole, then renamed into place).

        A result holding something that is not data raises TypeError naming where it is and the job.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        record = {
            "format": RESULT_FORMAT,
            "version": RESULT_VERSION,
            "key": _plain_key(key),
            "result": result,
        }
        try:
            write_data(path, record, where="result")
        except TypeError as e:
            where = "result['result']"
            raise TypeError(str(e).replace(where, f"the result of job {key}", 1)) from None
        return path

    def migrate_pickles(self) -> list[Path]:
        """Return the JSON files written for each pickled result in ``folder``, the pickles moved to ``pickled/``.

        This reads the pickles, and reading a pickle runs whatever code it holds: call it only for a run
        folder you trust (``rlq migrate-jobs``). A pickle whose result is not data is left where it is, and
        the error names it; the results converted before it stay converted.
        """
        written = []
        for pkl in self.pickled():
            with open(pkl, "rb") as f:
                saved = pickle.load(f)
            if not isinstance(saved, dict) or not isinstance(saved.get("key"), dict) or "result" not in saved:
                raise ValueError(f"{pkl} does not hold a job result ({{'key': ..., 'result': ...}})")
            try:
                path = self.save(saved["key"], saved["result"])
            except TypeError as e:
                raise ValueError(f"{pkl}: {e}") from None
            (self.folder / PICKLED_FOLDER).mkdir(exist_ok=True)
            os.replace(pkl, self.folder / PICKLED_FOLDER / pkl.name)
            written.append(path)
        return written


def _plain_key(key: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(key, default=str))


@dataclass
class _Batch:
    """One run_jobs call's bookkeeping: what runs, what finished, and what to tell whom."""

    func: Callable[..., Any]
    jobs: list[dict[str, Any]]
    labels: list[str]
    ids: list[str]
    store: ResultStore | None
    on_result: Callable[[int, Any], None] | None
    results: list[Any] = field(default_factory=list)
    failures: list[JobFailure] = field(default_factory=list)
    errors: dict[int, BaseException] = field(default_factory=dict)

    def finished(self, index: int, result: Any) -> None:
        self.results[index] = result
        if self.store is not None:
            self.store.save(ResultStore.key(self.jobs[index], self.labels[index]), result)
        if self.on_result is not None:
            self.on_result(index, result)

    def failed(self, index: int, exc: BaseException, crashed: bool = False) -> None:
        cause = getattr(exc, "cause", None) or exc  # a Ray task's error wraps the job's own
        keys = self.jobs[index].get("keys")
        text = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
        self.failures.append(
            JobFailure(index, self.labels[index], dict(keys) if isinstance(keys, dict) else {},
                       progress.error_text(cause), text)
        )  # fmt: skip
        self.errors[index] = cause
        if crashed:  # the worker died: nobody else reports the job's end
            progress.emit("job_end", id=self.ids[index], status="failed", error=progress.error_text(cause))
        logging.getLogger(__name__).warning(
            "job %s failed: %s", self.labels[index], progress.error_text(cause)
        )


def run_jobs(
    func: Callable[..., T],
    jobs: Sequence[dict[str, Any]],
    workers: int = 1,
    on_result: Callable[[int, T], None] | None = None,
    labels: Sequence[str] | None = None,
    *,
    executor: str | Executor = "processes",
    store: str | Path | ResultStore | None = None,
    on_error: str = "raise",
) -> JobResults:
    """Return ``[func(**job) for job in jobs]`` (a :class:`JobResults`), computed ``workers`` at a time.

    ``executor``: ``"processes"`` (``workers=1``: in this process), ``"ray"`` (tasks on a local Ray), or an
    :class:`Executor` (for Ray: the cluster's address and each task's resources, such as ``{"num_cpus": 1,
    "num_gpus": 0}``). ``on_result(index, result)`` is called as each job finishes (in completion order;
    results loaded from ``store`` first). ``labels`` name the jobs in progress bars and lines (default
    ``job 1``, ...). ``store``: a folder or a :class:`ResultStore` where each result is saved as it arrives
    and from which saved ones are loaded instead of run (those its ``keep`` accepts; the others run again,
    and their new results replace the saved ones). ``on_error``: ``"raise"`` the first job's error after
    all jobs ended, or ``"keep"`` going (``None`` in its place, listed in ``.failures``).
    """
    workers = check_positive_int("workers", workers)
    if not callable(func):
        raise TypeError(f"func must be callable, got {func!r}")
    executor = executor if isinstance(executor, Executor) else Executor(executor)
    if on_error not in ("raise", "keep"):
        raise ValueError(f"on_error must be 'raise' or 'keep', got {on_error!r}")
    batch = _new_batch(func, jobs, labels, store, on_result)
    loaded = _load_saved(batch)
    pending = [i for i in range(len(batch.jobs)) if i not in loaded]
    # how many run side by side: never more than there are jobs to run, and one where they run in this process
    used = min(workers, len(pending)) if executor.kind == "ray" or workers > 1 else min(1, len(pending))
    if pending:
        progress.emit(
            "jobs",
            ids=[batch.ids[i] for i in pending],
            labels=[batch.labels[i] for i in pending],
            workers=used,
        )
        _run_pending(batch, pending, workers, executor)
    if batch.failures and on_error == "raise":
        raise _first_error(batch)
    return JobResults(batch.results, sorted(batch.failures, key=lambda f: f.index), sorted(loaded), used)


def _new_batch(
    func: Callable[..., Any],
    jobs: Sequence[dict[str, Any]],
    labels: Sequence[str] | None,
    store: str | Path | ResultStore | None,
    on_result: Callable[[int, Any], None] | None,
) -> _Batch:
    """Return the :class:`_Batch` of one :func:`run_jobs` call; ValueError when ``labels`` do not match ``jobs``."""
    jobs = [dict(job) for job in jobs]
    names = [str(label) for label in labels] if labels is not None else []
    if names and len(names) != len(jobs):
        raise ValueError(f"{len(names)} labels for {len(jobs)} jobs")
    names = names or [f"job {i + 1}" for i in range(len(jobs))]
    batch_id = progress.new_id()
    if store is not None and not isinstance(store, ResultStore):
        store = ResultStore(store)
    return _Batch(
        func, jobs, names, [f"{batch_id}.{i}" for i in range(len(jobs))], store, on_result, [None] * len(jobs)
    )


def _run_pending(batch: _Batch, pending: list[int], workers: int, executor: Executor) -> None:
    """Run the ``pending`` jobs of ``batch`` on ``executor``, ``workers`` at a time (one: in this process)."""
    if executor.kind == "ray":
        _run_on_ray(batch, pending, workers, executor)
    elif workers == 1 or len(pending) <= 1:
        for index in pending:
            try:
                result = run_job(batch.func, batch.ids[index], batch.labels[index], batch.jobs[index])
            except Exception as exc:  # the other jobs go on; KeyboardInterrupt stops them all
                batch.failed(index, exc)
            else:
                batch.finished(index, result)
    else:
        _run_in_processes(batch, pending, workers)


def _first_error(batch: _Batch) -> BaseException:
    """Return the first failed job's error, with a note listing every failure when there was more than one job."""
    first = batch.failures[0]
    error = batch.errors[first.index]
    if len(batch.failures) > 1 or len(batch.jobs) > 1:
        error.add_note(
            f"{len(batch.failures)} of {len(batch.jobs)} jobs failed: "
            + "; ".join(f"{f.label}: {f.error}" for f in batch.failures)
        )
    return error


def _check_resources(resources: dict[str, float] | None) -> dict[str, float]:
    resources = dict(resources or {})
    unknown = sorted(set(resources) - {"num_cpus", "num_gpus", "memory", "resources"})
    if unknown:
        raise ValueError(f"resources: unknown key(s) {unknown}; use num_cpus, num_gpus, memory, resources")
    for name in ("num_cpus", "num_gpus"):
        value = resources.get(name, 1 if name == "num_cpus" else 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"resources[{name!r}] must be a number >= 0, got {value!r}")
        resources[name] = value
    return resources


def _load_saved(batch: _Batch) -> set[int]:
    if batch.store is None:
        return set()
    paths = [batch.store.path(ResultStore.key(job, batch.labels[i])) for i, job in enumerate(batch.jobs)]
    if len(set(paths)) != len(paths):
        raise ValueError("store: two jobs share the same keys (or labels); give each job its own `keys`")
    loaded = set()
    for index, job in enumerate(batch.jobs):
        found, result = batch.store.load(ResultStore.key(job, batch.labels[index]))
        if found and batch.store.stands(job, result):
            batch.results[index] = result
            loaded.add(index)
            if batch.on_result is not None:
                batch.on_result(index, result)
    return loaded


def _run_in_processes(batch: _Batch, pending: list[int], workers: int) -> None:
    context = multiprocessing.get_context("spawn")
    with (
        progress.relay_to_this_process() as poll,
        ProcessPoolExecutor(
            max_workers=min(workers, len(pending)),
            mp_context=context,
            initializer=exit_with_parent,
            initargs=(os.getpid(),),
        ) as pool,
    ):
        futures: dict[Future, int] = {}
        for i in pending:
            try:
                payload = cloudpickle.dumps((batch.func, batch.ids[i], batch.labels[i], batch.jobs[i]))
            except Exception as exc:  # this job cannot travel; the others still run
                batch.failed(i, exc, crashed=True)
            else:
                futures[pool.submit(_run_pickled_job, payload)] = i
        try:
            waiting: set[Future] = set(futures)
            while waiting:
                done, waiting = wait(waiting, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
                poll()
                for future in done:
                    index = futures[future]
                    try:
                        result = future.result()
                    except Exception as exc:
                        batch.failed(index, exc, crashed=_crashed(exc))
                    else:
                        batch.finished(index, result)
        except BaseException:
            for future, index in futures.items():
                if future.cancel():
                    progress.emit("job_end", id=batch.ids[index], status="cancelled")
            raise


PARENT_POLL_SECONDS = 0.5
"""How often a worker process checks that the process that started it is alive."""


def exit_with_parent(parent_pid: int) -> None:
    """Make this worker process exit once ``parent_pid`` (the process that started it) is gone.

    A worker outlives a parent killed by SIGKILL or SIGHUP (a closed terminal) and would go on training,
    writing into job folders that a ``--resume`` then trains beside it. A daemon thread checks every
    :data:`PARENT_POLL_SECONDS` whether this process has been re-parented and ends it at once (its
    checkpoints are written atomically, so the newest complete one stands).
    """
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(143)

    threading.Thread(target=watch, name="rlq-exit-with-parent", daemon=True).start()


def _crashed(exc: BaseException) -> bool:
    from concurrent.futures.process import BrokenProcessPool

    return isinstance(exc, BrokenProcessPool)


def ray_init_kwargs(workers: int, resources: dict[str, float], address: str | None) -> dict[str, Any]:
    """Return ``ray.init``'s arguments: quiet, no dashboard; ``address`` joins a cluster, else a local Ray.

    A local Ray gets CPUs for ``workers`` jobs of ``resources["num_cpus"]`` each (GPUs are detected).
    """
    kwargs: dict[str, Any] = dict(
        include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False, configure_logging=True
    )
    if address:
        return {"address": address, **kwargs}
    cpus = max(1, int(round(workers * max(resources.get("num_cpus", 1), 1))))
    return {"num_cpus": cpus, **kwargs}


def start_ray(kwargs: dict[str, Any], tries: int = 3) -> None:
    """Start or join Ray with ``ray.init(**kwargs)``, trying again when a local start times out.

    On a loaded machine Ray's start can outlast its own fixed 30 s wait for the raylet (seen here on 2
    cores at load 7-9, about one start in two); another try usually gets through. Raises RuntimeError
    saying what to do when no try does.
    """
    import ray

    for attempt in range(1, tries + 1):
        try:
            ray.init(**kwargs)
            return
        except Exception as exc:
            if "timed out during startup" not in str(exc):
                raise
            ray.shutdown()
            if attempt == tries:
                raise RuntimeError(
                    f"Ray did not start in {tries} tries (its raylet outlasted Ray's 30 s wait: a busy machine); "
                    "start it once with `ray start --head` and pass its address (auto), or try again"
                ) from exc
            logging.getLogger(__name__).warning(
                "Ray's start timed out (try %d of %d); trying again", attempt, tries
            )


def _run_on_ray(batch: _Batch, pending: list[int], workers: int, executor: Executor) -> None:
    import ray

    resources = executor.resources or {}
    started = not ray.is_initialized()
    if started:
        start_ray(ray_init_kwargs(workers, resources, executor.address))
    options = {k: v for k, v in resources.items() if k != "resources" or v}
    remote = ray.remote(_ray_task).options(max_retries=0, **options)
    func_ref = ray.put(batch.func)
    inflight: dict[Any, int] = {}
    try:
        with progress.relay_to_this_process() as poll:
            env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
            if not resources["num_gpus"]:
                env["CUDA_VISIBLE_DEVICES"] = ""  # Ray 2.60 leaves a task that asked for no GPU seeing all
            queue = list(pending)
            while queue or inflight:
                while queue and len(inflight) < workers:
                    i = queue.pop(0)
                    ref = remote.remote(func_ref, batch.ids[i], batch.labels[i], batch.jobs[i], env)
                    inflight[ref] = i
                done, _ = ray.wait(list(inflight), num_returns=1, timeout=POLL_SECONDS)
                poll()
                for ref in done:
                    _ray_result(batch, inflight.pop(ref), ref)
    except BaseException:
        for ref, index in inflight.items():
            ray.cancel(ref, force=True)
            progress.emit("job_end", id=batch.ids[index], status="cancelled")
        raise
    finally:
        if started:
            ray.shutdown()


def _ray_result(batch: _Batch, index: int, ref: Any) -> None:
    """Take one finished Ray task's outcome (a result, the job's error, or a lost worker) into ``batch``."""
    import ray

    try:
        # a copy: arrays from the object store are read-only views
        ok, reported, value = pickle.loads(pickle.dumps(ray.get(ref)))
    except Exception as exc:  # the worker died or the outcome could not come back
        batch.failed(index, exc, crashed=True)
        return
    if not reported:  # the task's machine cannot see the run's progress file: tell of its end from here
        status = {"status": "ok"} if ok else {"status": "failed", "error": progress.error_text(value)}
        progress.emit("job_end", id=batch.ids[index], **status)
    if ok:
        batch.finished(index, value)
    else:
        batch.failed(index, value)


def _ray_task(
    func: Callable[..., Any], job_id: str, label: str, job: dict[str, Any], env: dict[str, str]
) -> tuple[bool, bool, Any]:
    """Return ``(ok, reported, result or error)`` of ``run_job(...)`` in a Ray worker, with ``env`` set while it runs.

    ``env`` holds the driver's ``RLQ_*`` variables; ``reported`` is False when the progress file they name
    is not on this machine (no shared file system), and then the job reports nothing itself.
    """
    names = {k for k in os.environ if k.startswith(ENV_PREFIX)} | set(env)
    previous = {k: os.environ.get(k) for k in names}
    for name in names:
        os.environ.pop(name, None)
    os.environ.update(env)
    path = progress.progress_file()
    reported = path is None or path.parent.is_dir()
    if not reported:
        os.environ.pop(progress.PROGRESS_FILE_ENV, None)
    try:
        return True, reported, run_job(func, job_id, label, job)
    except Exception as exc:
        # a traceback does not travel with a pickled error: its text does, as a note
        exc.add_note("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip())
        return False, reported, exc
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run_pickled_job(payload: bytes) -> Any:
    """Return :func:`run_job` of the ``(func, job_id, label, job)`` that ``payload`` (cloudpickle) holds."""
    return run_job(*cloudpickle.loads(payload))


def run_job(func: Callable[..., T], job_id: str, label: str, job: dict[str, Any]) -> T:
    """Return ``func(**job)``, reported as job ``job_id`` (start, end, failure) in progress events."""
    with progress.job(job_id, label):
        return func(**job)
