"""Training progress as small events: written by training code in any process, shown by whoever listens.

Training code (:class:`rlq.rl.training_progress.TrainingProgress` inside every ``Checkpoints``, and
:func:`rlq.rl.parallel.run_jobs` around each job) calls :func:`emit`. Where an event goes depends on who
listens:

- ``RLQ_PROGRESS_FILE`` is set (``rlq run`` sets it to ``<run folder>/progress.jsonl`` and the notebook's
  kernel, and every worker process it spawns, inherit it): one JSON line per event is appended to that file,
  in one ``write`` per line, so processes can share it. The runner tails the file and draws the bars in the
  terminal (:class:`rlq.core.progress_board.Follower`).
- otherwise, in an interactive main process (a Jupyter kernel, or a script in a terminal): the events feed
  one in-process :class:`~rlq.core.progress_board.Board` that draws ``tqdm.auto`` bars (widgets in
  JupyterLab).
- otherwise (tests, logs, worker processes without a file) nothing is done. ``RLQ_PROGRESS=0`` turns every
  kind off.

Events are dicts with ``event`` (``jobs``, ``job_start``, ``job_end``, ``train_start``, ``train``,
``train_end``), ``id`` (the job or training they belong to), ``t`` (Unix time) and ``pid``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PROGRESS_FILE_ENV = "RLQ_PROGRESS_FILE"
"""Environment variable naming the JSON-lines file that progress events are appended to."""
PROGRESS_ENV = "RLQ_PROGRESS"
"""Set to ``0`` to show and write no progress at all."""
PROGRESS_FILE = "progress.jsonl"
"""The events file in a run folder."""
PROGRESS_SECONDS = 2.0
"""Seconds between two progress events of one training."""

_counter = iter(range(1, 1 << 62))
_job = threading.local()
_board_lock = threading.Lock()
_board: Any = None


def disabled() -> bool:
    """Return True when ``RLQ_PROGRESS=0`` (or ``off``/``false``) turns progress off."""
    return os.environ.get(PROGRESS_ENV, "").strip().lower() in ("0", "off", "false", "no")


def progress_file() -> Path | None:
    """Return the events file named by ``RLQ_PROGRESS_FILE``, or None."""
    value = os.environ.get(PROGRESS_FILE_ENV)
    return Path(value) if value and not disabled() else None


def in_jupyter() -> bool:
    """Return True inside a Jupyter kernel (JupyterLab, or a notebook that papermill executes)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def shows_here() -> bool:
    """Return True when this process draws progress bars itself: a main process in Jupyter or a terminal."""
    if disabled() or multiprocessing.parent_process() is not None:
        return False
    if in_jupyter():
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def enabled() -> bool:
    """Return True when an event emitted now goes somewhere (a file, or bars in this process)."""
    return progress_file() is not None or shows_here()


def new_id() -> str:
    """Return an id unique across the processes of a run (this pid and a counter)."""
    return f"{os.getpid()}-{next(_counter)}"


def emit(event: str, **fields: Any) -> dict[str, Any] | None:
    """Return the event sent (``event`` plus ``fields``, time and pid), or None when nobody listens."""
    path = progress_file()
    if path is None and not shows_here():
        return None
    record = {"event": event, "t": round(time.time(), 3), "pid": os.getpid(), **fields}
    if path is not None:
        line = (json.dumps(record, default=str) + "\n").encode()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)  # one write per line: lines of several processes never interleave
            finally:
                os.close(fd)
        except OSError:  # a full disk or a removed run folder must not stop training
            return None
    else:
        local_board().handle(record)
    return record


def local_board() -> Any:
    """Return this process's own board (``tqdm.auto`` bars, kept when finished), made on first use."""
    global _board
    with _board_lock:
        if _board is None:
            from tqdm.auto import tqdm

            from rlq.core.progress_board import Board

            _board = Board("bars", tqdm_class=tqdm, leave=True, lines=False)
        return _board


def current_job() -> tuple[str, str] | None:
    """Return ``(id, label)`` of the job this thread is running (see :func:`job`), or None."""
    return getattr(_job, "value", None)


@contextmanager
def job(job_id: str, label: str) -> Iterator[None]:
    """Report a job's start and end (``ok``, or ``failed`` with the error) around the ``with`` body.

    Trainings inside the body report under the job's id, so a job shows as one bar.
    """
    previous, _job.value = current_job(), (job_id, label)
    start = time.perf_counter()
    emit("job_start", id=job_id, label=label)
    try:
        yield
    except BaseException as exc:
        emit("job_end", id=job_id, status="failed", error=error_text(exc), seconds=_since(start))
        raise
    else:
        emit("job_end", id=job_id, status="ok", seconds=_since(start))
    finally:
        _job.value = previous


def error_text(exc: BaseException) -> str:
    """Return ``"Type: message"`` of an exception, on one line and at most 200 characters."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


def _since(start: float) -> float:
    return round(time.perf_counter() - start, 2)


class ProgressReader:
    """Read the events appended to a file since the last read (a partial last line waits for its end).

    ``from_end`` skips what the file already holds (an earlier attempt's events).
    """

    def __init__(self, path: str | Path, from_end: bool = True):
        self.path = Path(path)
        self.offset = self.path.stat().st_size if from_end and self.path.exists() else 0

    def read(self) -> list[dict[str, Any]]:
        """Return the complete events written since the last call, oldest first."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        events = []
        for line in data[:end].splitlines():
            try:
                event = json.loads(line)
            except ValueError:  # a damaged line is skipped, not fatal
                continue
            if isinstance(event, dict):
                events.append(event)
        return events


@contextmanager
def relay_to_this_process() -> Iterator[Callable[[], None]]:
    """Yield ``poll()``, which shows in this process what worker processes started inside the block report.

    Worker processes draw nothing themselves. When nobody listens to a file already and this process shows
    bars (JupyterLab), the workers are pointed at a temporary events file, which ``poll()`` reads into this
    process's board; otherwise ``poll()`` does nothing.
    """
    if progress_file() is not None or not shows_here():
        yield lambda: None
        return
    fd, name = tempfile.mkstemp(prefix="rlq-progress-", suffix=".jsonl")
    os.close(fd)
    reader = ProgressReader(name, from_end=False)

    def poll() -> None:
        for event in reader.read():
            local_board().handle(event)

    os.environ[PROGRESS_FILE_ENV] = name
    try:
        yield poll
    finally:
        os.environ.pop(PROGRESS_FILE_ENV, None)
        poll()
        os.unlink(name)
