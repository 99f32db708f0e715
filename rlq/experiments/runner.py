"""Execute an experiment notebook with papermill into a run folder, and resume one that stopped."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlq.core.jsonio import read_json, write_json
from rlq.core.progress import PROGRESS_FILE, PROGRESS_FILE_ENV, ProgressReader
from rlq.core.progress_board import Follower, terminal_board
from rlq.experiments.registry import Experiment, ExperimentError, get_experiment
from rlq.experiments.reuse import check_job_store, plan_reuse, replaced_runs, save_reuse
from rlq.experiments.run_folders import (
    NOTEBOOK_FILE,
    PARAMS_FILE,
    RESULTS_FILE,
    RUN_DIR_ENV,
    RUNNER_FILE,
    Heartbeat,
    new_run_dir,
    run_state,
    utc_stamp,
)
from rlq.experiments.run_lock import LOCK_FILE, run_folder_lock

log = logging.getLogger(__name__)


@dataclass
class RunOutcome:
    """What one execution of an experiment notebook produced."""

    path: Path
    status: str
    results: dict[str, Any]

    @property
    def ok(self) -> bool:
        """Return True when the notebook ran to its end."""
        return self.status == "ok"


def _error_text(exc: BaseException) -> str:
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    if ename:
        cell = getattr(exc, "exec_count", None)
        return f"{ename}: {evalue}" + (f" (cell [{cell}])" if cell is not None else "")
    return f"{type(exc).__name__}: {exc}"


def _on_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


@contextmanager
def live_progress(path: Path, show: bool = True) -> Iterator[None]:
    """Point training progress at ``path/progress.jsonl`` for the block and, when ``show``, draw it on stderr.

    The kernel and its worker processes inherit ``RLQ_PROGRESS_FILE`` (:mod:`rlq.core.progress`); a thread
    tails the file: bars per training job on a terminal, one line per finished job otherwise (logs).
    """
    previous = os.environ.get(PROGRESS_FILE_ENV)
    os.environ[PROGRESS_FILE_ENV] = str(path / PROGRESS_FILE)
    follower = Follower(path / PROGRESS_FILE, terminal_board(sys.stderr)).start() if show else None
    try:
        yield
    finally:
        if follower is not None:
            follower.stop()
        if previous is None:
            os.environ.pop(PROGRESS_FILE_ENV, None)
        else:
            os.environ[PROGRESS_FILE_ENV] = previous


def execute(
    experiment: Experiment,
    params: dict[str, Any],
    path: Path,
    *,
    preset: str | None = None,
    progress: bool = True,
    log_output: bool = False,
    reanalysis: bool = False,
) -> RunOutcome:
    """Return the outcome of running ``experiment`` with ``params`` in the existing run folder ``path``.

    ``train_seconds`` in results.json adds up the attempts that trained; a ``reanalysis`` (``--rerun`` of a
    finished run, which retrains nothing) records its own ``run_seconds`` but leaves ``train_seconds`` as it was.
    """
    import papermill as pm

    from rlq.experiments.kernel_log import RunKernelManager

    path = Path(path).resolve()
    _begin(path, experiment, params, preset)
    previous_env = os.environ.get(RUN_DIR_ENV)
    os.environ[RUN_DIR_ENV] = str(path)  # the kernel inherits it; rlq.record() writes there
    start = time.perf_counter()
    status, error = "ok", None
    heartbeat, events = Heartbeat(path), ProgressReader(path / PROGRESS_FILE)  # this attempt's events
    try:
        heartbeat.start()
        with live_progress(path, show=progress):
            pm.execute_notebook(
                str(experiment.path),
                str(path / NOTEBOOK_FILE),
                parameters=params,
                cwd=str(path),
                progress_bar=progress and _on_terminal(),  # papermill's cell counter is noise in a log
                log_output=log_output,
                request_save_on_cell_execute=True,
                kernel_manager_class=RunKernelManager,  # stderr into kernel.log, sockets no other kernel takes
            )
    except KeyboardInterrupt:
        status, error = (
            "interrupted",
            "KeyboardInterrupt: stopped by the user; resume with `rlq run --resume`",
        )
        raise
    except Exception as exc:  # any failure of the notebook or its kernel is the run's result, not a crash
        status, error = "failed", _error_text(exc)
    finally:
        heartbeat.stop()
        if previous_env is None:
            os.environ.pop(RUN_DIR_ENV, None)
        else:
            os.environ[RUN_DIR_ENV] = previous_env
        results = _finish(path, status, error, round(time.perf_counter() - start, 2), reanalysis, events)
    return RunOutcome(path, status, results)


RESERVE_FILE = ".reserved"
"""Space a run holds in its folder while it runs, given up for the last write of results.json on a full disk."""
RESERVE_BYTES = 1 << 20


class RunNotStarted(ExperimentError):
    """The run folder could not be written before the notebook started (a full disk, say): nothing ran."""


def _begin(path: Path, experiment: Experiment, params: dict[str, Any], preset: str | None) -> None:
    """Reserve space in ``path`` and write its params.json and a ``running`` results.json, or raise
    :class:`RunNotStarted` leaving both as they were."""
    try:
        with open(path / RESERVE_FILE, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, RESERVE_BYTES)
        write_json(path / PARAMS_FILE, params)
        # an attempt starts from the earlier attempts' training time only: their numbers are archived under
        # attempts/<n>/, and a re-attempt that fails before recording must not show them as its own
        earlier = read_json(path / RESULTS_FILE)
        results = {k: earlier[k] for k in ("train_seconds", "reused", "retrained") if k in earlier}
        results.update(status="running", experiment=experiment.name, preset=preset, started=utc_stamp())
        write_json(path / RESULTS_FILE, results)
    except OSError as e:
        (path / RESERVE_FILE).unlink(missing_ok=True)
        raise RunNotStarted(f"{path}: cannot write the run folder ({e.strerror or e})") from None


def _finish(
    path: Path, status: str, error: str | None, seconds: float, reanalysis: bool, events: ProgressReader
) -> dict[str, Any]:
    """Return the run's results after writing them with its end (status, error, times) into results.json.

    ``workers_used`` is the most training jobs that ran side by side, as the attempt's progress ``events`` say
    (:func:`rlq.rl.parallel.run_jobs` reports it): ``-p workers 10000`` over 6 jobs uses 6.

    On a full disk the space held since :func:`_begin` is given up for this write; where even that fails,
    the results are returned and the failure is printed, results.json still saying ``running``.
    """
    results = read_json(path / RESULTS_FILE)  # now holding what the notebook recorded
    results.update(status=status, finished=utc_stamp(), run_seconds=seconds)
    if not reanalysis:
        results["train_seconds"] = round(float(results.get("train_seconds") or 0.0) + seconds, 2)
    if error:
        results["error"] = error
    used = [
        e["workers"] for e in events.read() if e.get("event") == "jobs" and isinstance(e.get("workers"), int)
    ]
    if used:
        results["workers_used"] = max(used)
    try:
        try:
            write_json(path / RESULTS_FILE, results)
        except OSError:
            (path / RESERVE_FILE).unlink(missing_ok=True)
            write_json(path / RESULTS_FILE, results)
    except OSError as e:
        print(
            f"rlq: cannot record the run's end in {path / RESULTS_FILE}: {e.strerror or e}", file=sys.stderr
        )
    finally:
        (path / RESERVE_FILE).unlink(missing_ok=True)
    return results


def run_experiment(
    name: str,
    preset: str | None = None,
    overrides: list[tuple[str, str]] | None = None,
    out: str | Path = "runs",
    reuse: Sequence[str | Path] = (),
    retrain: Sequence[str] = (),
    **kwargs: Any,
) -> RunOutcome:
    """Return the outcome of running experiment ``name`` into a new run folder under ``out``.

    Every input is validated before the folder is created or a kernel starts. The finished runs of the
    folders ``reuse`` are loaded instead of trained (:mod:`rlq.experiments.reuse`), but for the runs that the
    ``retrain`` specs name; results.json lists them under ``reused``, and under ``retrained`` each replaced run
    with its spec, source, key and headline numbers.
    """
    experiment = get_experiment(name)
    params = experiment.resolve(preset, overrides)
    experiment.check_requirements()
    plan = plan_reuse(reuse, experiment.name, params, retrain) if reuse or retrain else []
    replaced = replaced_runs(reuse, experiment.name, params, retrain) if retrain else []
    path = create_run_dir(out, experiment.name)
    try:
        with contextlib.ExitStack() as held:
            with _unwritten(path):
                held.enter_context(run_folder_lock(path))
                if plan:
                    retrained = {"retrained": replaced} if retrain else {}
                    write_json(path / RESULTS_FILE, {"reused": save_reuse(plan, path), **retrained})
            return execute(experiment, params, path, preset=params.get("preset", preset), **kwargs)
    except RunNotStarted as e:  # only before the notebook started: execute records every later failure
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # the experiment's folder, if this run was its first
        raise ExperimentError(f"{e}; nothing ran, and the folder was removed") from None


@contextmanager
def _unwritten(path: Path) -> Iterator[None]:
    """Turn an OSError of the block (a full disk, say) into :class:`RunNotStarted` naming ``path``."""
    try:
        yield
    except OSError as e:
        raise RunNotStarted(f"{path}: cannot write the run folder ({e.strerror or e})") from None


def check_out_dir(out: str | Path) -> Path:
    """Return ``out`` if run folders can be created under it (creating nothing), else raise ExperimentError."""
    out = Path(out)
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ExperimentError(f"--out {out}: {existing} is a file, not a folder for run folders")
    if not writable(existing):
        raise ExperimentError(f"--out {out}: cannot create a run folder there ({existing} is not writable)")
    return out


def writable(path: str | Path) -> bool:
    """Return True when ``path`` (a folder: files can be created in it) may be written: the system grants it and,
    for root (whom no permission stops), its mode bits allow some write, so a path made read-only is taken as
    meant."""
    path = Path(path)
    if not os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0)):
        return False
    return os.geteuid() != 0 or bool(path.stat().st_mode & 0o222)


def check_run_folder_writable(path: Path) -> None:
    """Raise ExperimentError naming the first folder of run folder ``path`` (or a file it rewrites in place) that
    cannot be written; checked before anything is written there."""
    folders = [Path(folder) for folder, _, _ in os.walk(path)]
    in_place = [path / name for name in (LOCK_FILE, PROGRESS_FILE) if (path / name).exists()]
    for where in folders + in_place:
        if not writable(where):
            raise ExperimentError(
                f"--resume {path}: the run folder is read-only ({where} is not writable); nothing was written"
            )


def create_run_dir(out: str | Path, name: str) -> Path:
    """Return a new run folder for experiment ``name`` under ``out``, or raise ExperimentError saying why not."""
    out = check_out_dir(out)
    try:
        return new_run_dir(out, name)
    except OSError as e:
        raise ExperimentError(f"--out {out}: cannot create a run folder there ({e.strerror or e})") from None


def resume_run(path: str | Path, rerun: bool = False, **kwargs: Any) -> RunOutcome:
    """Return the outcome of re-executing the run folder ``path`` with its own parameters.

    The previous attempt's notebook and results are kept under ``attempts/<n>/``; the notebook resumes
    from the checkpoints it left in the folder. A finished run is refused unless ``rerun``: then the
    current notebook runs again over the finished checkpoints (nothing retrains), e.g. after its
    analysis changed.
    """
    path = Path(path)
    if not (path / PARAMS_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a run folder (no {PARAMS_FILE})")
    check_run_folder_writable(path)
    with run_folder_lock(path):  # one writer per run folder: checked, archived and run under the lock
        return _resume_locked(path, rerun, **kwargs)


def _resume_locked(path: Path, rerun: bool, **kwargs: Any) -> RunOutcome:
    params_file, results_file = path / PARAMS_FILE, path / RESULTS_FILE
    previous = read_json(results_file)
    if run_state(path, previous) == "running":
        runner = read_json(path / RUNNER_FILE)
        raise ValueError(
            f"{path} is still running (pid {runner.get('pid')} on {runner.get('host')}, heartbeat "
            f"{runner.get('at')}); wait for it or stop it before resuming"
        )
    if previous.get("status") == "ok" and not rerun:
        raise ValueError(
            f"{path} finished successfully; start a new run, or pass --rerun to analyse its checkpoints again"
        )
    experiment = get_experiment(previous.get("experiment") or path.parent.name)
    params = read_json(params_file)
    unknown = set(params) - set(experiment.parameters)
    if unknown:
        raise ValueError(f"{path}: parameters {sorted(unknown)} no longer exist in {experiment.name}")
    missing = sorted(set(experiment.parameters) - set(params))
    if missing:
        raise ExperimentError(
            f"{path / PARAMS_FILE} lacks {missing}: a run folder records every parameter; restore them (or start a "
            "new run) rather than resume with the notebook's defaults"
        )
    for name, value in params.items():  # as `rlq run` checks new ones, before the kernel starts
        experiment.parameters[name].check(value, f"{path / PARAMS_FILE}")
    check_job_store(path, f"--resume {path}")  # its saved results: data, finite, readable
    n = 1
    while (path / "attempts" / str(n)).exists():
        n += 1
    archive = path / "attempts" / str(n)
    reanalysis = previous.get("status") == "ok"
    try:
        with _unwritten(path):
            archive.mkdir(parents=True)
            for name in (NOTEBOOK_FILE, RESULTS_FILE):
                if (path / name).exists():
                    shutil.copy2(path / name, archive / name)
        return execute(
            experiment, params, path, preset=previous.get("preset"), reanalysis=reanalysis, **kwargs
        )
    except RunNotStarted as e:  # only before the notebook started: execute records every later failure
        shutil.rmtree(archive, ignore_errors=True)
        raise ExperimentError(f"{e}; nothing ran, and the run folder is as it was") from None
