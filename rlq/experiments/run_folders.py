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
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlq.core.jsonio import json_safe, read_json, write_json

RUN_DIR_ENV = "RLQ_RUN_DIR"
RESULTS_FILE = "results.json"
PARAMS_FILE = "params.json"
NOTEBOOK_FILE = "output.ipynb"
RUNNER_FILE = "runner.json"
"""Who executes the run (pid, host) and its heartbeat, rewritten by the runner while the notebook runs."""
RUN_FILES_FOLDER = "actors"
"""A run folder's subfolder of the files its later cells read back (a notebook's final actors, each saved small
by :func:`rlq.sb3.checkpoint.save_dense_actor`): ``rlq publish`` commits it beside the tables, and ``--reuse``
copies it into the new run folder with the runs."""
RUN_FILES_MAX_BYTES = 5_000_000
"""The most a run's :data:`RUN_FILES_FOLDER` may hold to be published (what ten TD3 actors take, several times over)."""
HEARTBEAT_SECONDS = 15.0
"""Seconds between two heartbeats of a live runner."""
STALE_AFTER_SECONDS = 120.0
"""A running run whose runner sits on another host is taken as dead when its heartbeat is this old."""
#: Keys of results.json owned by the runner; a notebook may not record them.
RESERVED_KEYS = frozenset(
    {
        "status",
        "error",
        "experiment",
        "preset",
        "run_seconds",
        "train_seconds",
        "started",
        "finished",
        "reused",
        "retrained",
        "workers_used",
    }
)


def utc_stamp(now: datetime | None = None) -> str:
    """Return a compact, sortable UTC timestamp such as ``20261130T051502Z``."""
    return (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def new_run_dir(
    parent: str | Path, name: str, *, now: datetime | None = None, run_id: str | None = None
) -> Path:
    """Return a freshly created ``parent/name/<UTC timestamp>-<short id>/``; never reuses an existing folder.

    A drawn id that is taken already (many folders made in one second) is drawn again; a given ``run_id``
    that is taken raises FileExistsError rather than writing into another run's folder.
    """
    folder = Path(parent) / name
    folder.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        path = folder / f"{utc_stamp(now)}-{run_id or secrets.token_hex(3)}"
        try:
            path.mkdir(exist_ok=False)
            return path
        except FileExistsError:
            if run_id is not None:
                raise
    raise FileExistsError(f"no free run folder name under {folder} after 100 draws")


INTERACTIVE_ENV = "RLQ_INTERACTIVE_RUN_DIR"
"""The run folder a kernel made for itself (:func:`run_dir` outside the runner), beside ``RLQ_RUN_DIR``."""


class ParametersChanged(ValueError):
    """A parameter of the kernel changed after its run folder was made: its saved runs were trained otherwise.

    IPython shows it as its one line, without a traceback (``_render_traceback_``): it is advice, not a fault.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def short_path(path: str | Path) -> str:
    """Return ``path`` relative to the current directory when that is shorter (a notebook prints its run
    folder so, not as a machine path), else as it is."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        relative = os.path.relpath(path)
        return relative if len(relative) < len(str(path)) else str(path)


def run_dir() -> Path:
    """Return this process's run folder: the runner's ``RLQ_RUN_DIR``, or a new ``runs/interactive/...`` one.

    In JupyterLab (no runner) the first call creates a folder, writes its ``params.json``
    (:func:`describe_interactive_run`) and exports it in ``RLQ_RUN_DIR``, so later calls in the same kernel,
    and :func:`record`, use the same folder, as long as the parameters keep their values: once one that
    shapes a training has changed (:func:`changed_parameters`), the next call creates a new folder, so the
    changed settings train anew instead of meeting the runs of the old ones.
    """
    env = os.environ.get(RUN_DIR_ENV)
    if env and not (os.environ.get(INTERACTIVE_ENV) == env and changed_parameters(env)):
        path = Path(env)
        path.mkdir(parents=True, exist_ok=True)
        return path
    from rlq.experiments.paths import default_runs_dir

    if env:  # the kernel's earlier folder stays as it is, resumable with its own parameters
        for heartbeat in [h for h in _KERNEL_HEARTBEAT if h.path == Path(env)]:
            heartbeat.stop()
            _KERNEL_HEARTBEAT.remove(heartbeat)
    path = new_run_dir(default_runs_dir(), "interactive").resolve()
    describe_interactive_run(path)
    os.environ[RUN_DIR_ENV] = os.environ[INTERACTIVE_ENV] = str(path)
    return path


def changed_parameters(path: str | Path) -> dict[str, tuple[Any, Any]]:
    """Return ``{name: (in params.json, in this kernel)}`` for each parameter of run folder ``path`` whose value
    in this kernel is another now; the ones of how it runs and shows (``workers``, ...) are left out."""
    from rlq.experiments.results import PLUMBING_KEYS

    namespace, _ = _kernel_notebook()
    changed = {}
    for name, then in read_json(Path(path) / PARAMS_FILE).items():
        if name in PLUMBING_KEYS or name not in namespace:
            continue
        try:
            now = json.loads(json.dumps(json_safe(namespace[name], name, strict=True)))
        except TypeError:
            continue
        if now != then:
            changed[name] = (then, now)
    return changed


def check_parameters_unchanged(path: str | Path) -> None:
    """Raise :class:`ParametersChanged` (one line: what changed, what to do) when this kernel made run folder
    ``path`` for itself and has changed a parameter since: its saved runs would stand for the new values."""
    if os.environ.get(INTERACTIVE_ENV) != str(path):
        return
    changed = changed_parameters(path)
    if changed:
        shown = ", ".join(f"{name} {then!r} -> {now!r}" for name, (then, now) in changed.items())
        raise ParametersChanged(
            f"Run All to train the new values in a new run folder: {shown} since run folder "
            f"{Path(path).name} was made"
        )


def _kernel_notebook() -> tuple[dict[str, Any], Path | None]:
    """Return the IPython namespace of this process ({} outside IPython) and the notebook it runs, if known."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    namespace = getattr(shell, "user_ns", None) or {}
    session = os.environ.get("JPY_SESSION_NAME") or namespace.get("__session__")  # set by JupyterLab
    return namespace, Path(session) if session else None


def describe_interactive_run(path: Path) -> None:
    """Write what the CLI needs to list and resume the new run folder ``path`` of a notebook outside the runner.

    ``params.json`` holds the values of the experiment's parameters in the kernel (JupyterLab names the
    notebook; the experiment is the registry's notebook of that name), ``{}`` where no experiment notebook is
    known. For a known one, ``results.json`` says ``running`` and the kernel keeps a heartbeat in
    ``runner.json`` and the folder's lock until it ends: ``rlq runs`` then shows it running, and interrupted
    once the kernel is gone, when ``rlq run --resume`` continues it with those parameters.
    """
    from rlq.experiments.registry import ExperimentError, get_experiment

    namespace, notebook = _kernel_notebook()
    experiment = None
    if notebook is not None:
        try:
            experiment = get_experiment(notebook.stem)
        except ExperimentError:
            experiment = None
    params = {}
    for name in experiment.parameters if experiment is not None else ():
        try:  # a value the kernel replaced by something JSON cannot hold is left out (a resume names it)
            params[name] = json_safe(namespace[name], name, strict=True)
        except (KeyError, TypeError):
            continue
    write_json(path / PARAMS_FILE, params)
    if experiment is None:
        return
    from rlq.experiments.run_lock import hold_run_folder

    status = {"status": "running", "experiment": experiment.name, "preset": params.get("preset")}
    write_json(path / RESULTS_FILE, {**status, "started": utc_stamp()})
    hold_run_folder(path)
    _KERNEL_HEARTBEAT.append(Heartbeat(path).start())


_KERNEL_HEARTBEAT: list[Heartbeat] = []


class Recorded(dict):
    """The numbers :func:`record` wrote: every digit in ``results.json``, 3 significant figures when shown."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Show the numbers at 3 significant figures (IPython's display of a cell's last value)."""
        printer.pretty(three_figures(dict(self)))


def three_figures(value: Any) -> Any:
    """Return ``value`` with each finite float, in lists and dicts too, rounded to 3 significant figures."""
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.3g}") + 0.0  # + 0.0: -0.0 reads 0.0
    if isinstance(value, dict):
        return {key: three_figures(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(three_figures(item) for item in value)
    return value


def record(**numbers: Any) -> Recorded:
    """Return the notebook's headline numbers after merging them into its run folder's ``results.json``."""
    clash = RESERVED_KEYS.intersection(numbers)
    if clash:
        raise ValueError(f"record(): {sorted(clash)} are reserved for the runner; choose other names")
    try:
        clean = {k: json_safe(v, k, strict=True) for k, v in numbers.items()}
    except TypeError as exc:
        raise TypeError(f"record(): {exc}") from None
    path = run_dir() / RESULTS_FILE
    merged = read_json(path)
    merged.update(clean)
    write_json(path, merged)
    return Recorded(clean)


def load_run(path: str | Path) -> dict[str, Any]:
    """Return a run folder's ``params`` and ``results`` with its ``path``, for summaries and reports."""
    path = Path(path)
    return {"path": path, "params": read_json(path / PARAMS_FILE), "results": read_json(path / RESULTS_FILE)}


def list_runs(parent: str | Path, experiment: str | None = None) -> list[Path]:
    """Return the run folders under ``parent`` (optionally of one experiment), oldest first."""
    parent = Path(parent)
    pattern = f"{experiment or '*'}/*/{RESULTS_FILE}"
    return sorted((p.parent for p in parent.glob(pattern)), key=lambda p: p.name)


def write_heartbeat(path: str | Path) -> None:
    """Write this process's pid, host and the current time into the run folder's ``runner.json``."""
    write_json(
        Path(path) / RUNNER_FILE,
        {"pid": os.getpid(), "host": socket.gethostname(), "heartbeat": time.time(), "at": utc_stamp()},
    )


class Heartbeat:
    """Rewrite ``runner.json`` every ``HEARTBEAT_SECONDS`` in a daemon thread while a run executes.

    A separate file from ``results.json``, which the notebook's kernel rewrites with :func:`record`: a
    second writer there could lose a recorded number.
    """

    def __init__(self, path: str | Path, every: float = HEARTBEAT_SECONDS):
        self.path, self.every = Path(path), every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="rlq-heartbeat", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            try:
                write_heartbeat(self.path)
            except OSError:  # a full disk or a removed folder must not kill the run
                pass

    def start(self) -> Heartbeat:
        """Return this heartbeat after writing the first beat and starting the thread."""
        write_heartbeat(self.path)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating (safe to call when :meth:`start` failed or never ran)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def run_state(path: str | Path, results: dict[str, Any] | None = None, now: float | None = None) -> str:
    """Return a run folder's state: its recorded status, with a dead ``running`` run as ``interrupted``.

    A run is live when its runner's process exists on this host (and its heartbeat is fresh), or, on
    another host, when its heartbeat is younger than ``STALE_AFTER_SECONDS``. A ``running`` run with no
    ``runner.json`` (killed before its first heartbeat, or by a runner that writes none) counts as interrupted.
    """
    path = Path(path)
    results = read_json(path / RESULTS_FILE) if results is None else results
    status = results.get("status", "unknown")
    if status != "running":
        return status
    try:
        runner = read_json(path / RUNNER_FILE)
    except ValueError:
        runner = {}
    if not runner:
        return "interrupted"
    age = (time.time() if now is None else now) - float(runner.get("heartbeat", 0))
    if runner.get("host") == socket.gethostname():
        alive = _pid_alive(int(runner.get("pid", -1))) and age < STALE_AFTER_SECONDS
    else:
        alive = age < STALE_AFTER_SECONDS
    return "running" if alive else "interrupted"
