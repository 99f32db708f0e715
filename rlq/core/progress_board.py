"""Show progress events (:mod:`rlq.core.progress`): a bar per training job, or one log line per finished job.

A :class:`Board` turns events into ``tqdm`` bars (``"bars"``: a bar per running training with its steps,
steps/s, time left and latest return, plus a ``jobs`` bar counting the finished jobs of a batch) or into
plain lines (``"lines"``: one per finished job or training, fit for logs). A :class:`Follower` tails a run
folder's ``progress.jsonl`` into a board from a thread, which is how ``rlq run`` shows what the notebook's
kernel and its worker processes report.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rlq.core.progress import ProgressReader

POLL_SECONDS = 0.5
"""Seconds between two reads of a followed events file."""


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60:02d}:{rest % 60:02d}"


@dataclass
class _Job:
    """What the board knows of one job or training."""

    label: str
    batch: _Batch | None = None
    status: str = "waiting"
    steps: int = 0
    total: int | None = None
    trained: int | None = None
    train_seconds: float | None = None
    episode_return: float | None = None
    train_status: str | None = None
    bar: Any = None


@dataclass
class _Batch:
    """The jobs of one ``run_jobs`` call."""

    ids: list[str]
    bar: Any = None
    finished: dict[str, str] = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(1 for s in self.finished.values() if s == status)

    def tag(self) -> str:
        failed = self.count("failed")
        return f"[{len(self.finished)}/{len(self.ids)}" + (f", {failed} failed]" if failed else "]")


class Board:
    """Draw progress events as bars (``mode="bars"``) or write a line per finished job (``mode="lines"``).

    ``stream`` receives bars and lines (default: stderr); ``tqdm_class`` draws the bars (default: ``tqdm``'s
    terminal bar; ``tqdm.auto.tqdm`` in Jupyter); ``leave`` keeps finished bars on screen; ``lines`` writes a
    line per finished job in bars mode too (above the bars). ``prefix`` starts every line.
    """

    def __init__(
        self,
        mode: str = "lines",
        stream: IO[str] | None = None,
        tqdm_class: Any = None,
        leave: bool = False,
        lines: bool = True,
        prefix: str = "rlq: ",
    ):
        if mode not in ("bars", "lines"):
            raise ValueError(f"mode must be 'bars' or 'lines', got {mode!r}")
        if tqdm_class is None and mode == "bars":
            from tqdm import tqdm as tqdm_class
        self.mode, self.stream, self.tqdm = mode, stream, tqdm_class
        self.leave, self.lines, self.prefix = leave, lines or mode == "lines", prefix
        self.jobs: dict[str, _Job] = {}
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ events

    def handle(self, event: dict[str, Any]) -> None:
        """Show one event (unknown events and events of unknown jobs are ignored)."""
        handler = getattr(self, f"_on_{event.get('event')}", None)
        if handler is None:
            return
        with self._lock:
            try:
                handler(event)
            except (KeyError, TypeError, ValueError):  # a malformed event must not stop the run
                pass

    def _job(self, event: dict[str, Any]) -> _Job:
        job_id = str(event["id"])
        if job_id not in self.jobs:
            self.jobs[job_id] = _Job(str(event.get("label") or job_id))
        return self.jobs[job_id]

    def _on_jobs(self, event: dict[str, Any]) -> None:
        ids, labels = [str(i) for i in event["ids"]], list(event["labels"])
        batch = _Batch(ids)
        width = max((len(str(label)) for label in labels), default=0)
        for job_id, label in zip(ids, labels, strict=True):
            self.jobs[job_id] = _Job(str(label).ljust(width) if self.mode == "bars" else str(label), batch)
        if self.mode == "bars" and len(ids) > 1:
            batch.bar = self._bar(total=len(ids), desc="jobs".ljust(width), unit="job", unit_scale=False)
            batch.bar.set_postfix_str(f"{len(ids)} waiting")

    def _on_job_start(self, event: dict[str, Any]) -> None:
        job = self._job(event)
        job.status = "running"
        self._batch_postfix(job.batch)

    def _on_train_start(self, event: dict[str, Any]) -> None:
        job = self._job(event)
        job.status, job.train_status = "running", None
        job.steps, job.total = int(event.get("steps", 0)), event.get("total")
        if self.mode == "bars":
            self._close_bar(job)
            job.bar = self._bar(
                total=job.total, initial=job.steps, desc=job.label, unit="step", unit_scale=True
            )
        self._batch_postfix(job.batch)

    def _on_train(self, event: dict[str, Any]) -> None:
        job = self._job(event)
        if event.get("return") is not None:
            job.episode_return = float(event["return"])
        self._advance(job, int(event.get("steps", job.steps)))

    def _on_train_end(self, event: dict[str, Any]) -> None:
        job = self._job(event)
        if event.get("return") is not None:
            job.episode_return = float(event["return"])
        job.train_status = str(event.get("status", "ok"))
        job.trained, job.train_seconds = event.get("trained"), event.get("seconds")
        job.total = event.get("total", job.total)
        self._advance(job, int(event.get("steps", job.steps)))
        if job.batch is None:  # a training of its own: it is the job
            job.status = "failed" if job.train_status == "failed" else "done"
            self._close_bar(job)
            self._write(self._train_line(job, event.get("error")))

    def _on_job_end(self, event: dict[str, Any]) -> None:
        job = self._job(event)
        job.status = {"ok": "done"}.get(str(event.get("status")), str(event.get("status")))
        self._close_bar(job)
        batch = job.batch
        if batch is not None:
            batch.finished[str(event["id"])] = job.status
            if batch.bar is not None:
                batch.bar.update(1)
            self._batch_postfix(batch)
        self._write(self._job_line(job, event))

    # ------------------------------------------------------------------ drawing

    def _bar(self, **kwargs: Any) -> Any:
        if self.stream is not None:
            kwargs["file"] = self.stream
        # events come every few seconds: draw each one (no minimum interval), with a slowly smoothed rate
        return self.tqdm(
            leave=self.leave, dynamic_ncols=True, smoothing=0.1, mininterval=0, miniters=1, **kwargs
        )

    def _advance(self, job: _Job, steps: int) -> None:
        delta, job.steps = steps - job.steps, steps
        if job.bar is None:
            return
        if job.episode_return is not None:
            job.bar.set_postfix_str(f"return {job.episode_return:.4g}", refresh=False)
        if delta > 0:
            job.bar.update(delta)
        else:
            job.bar.refresh()

    def _close_bar(self, job: _Job) -> None:
        if job.bar is not None:
            job.bar.close()
            job.bar = None

    def _batch_postfix(self, batch: _Batch | None) -> None:
        if batch is None or batch.bar is None:
            return
        running = sum(1 for i in batch.ids if self.jobs[i].status == "running")
        waiting = sum(1 for i in batch.ids if self.jobs[i].status == "waiting")
        parts = [f"{n} {what}" for n, what in ((running, "running"), (waiting, "waiting")) if n]
        parts += [f"{batch.count(s)} {s}" for s in ("failed", "cancelled") if batch.count(s)]
        batch.bar.set_postfix_str(", ".join(parts))

    def _write(self, text: str) -> None:
        if not self.lines:
            return
        text = self.prefix + text
        if self.mode == "bars":
            self.tqdm.write(text, file=self.stream or sys.stderr)
        else:
            stream = self.stream or sys.stderr
            stream.write(text + "\n")
            stream.flush()

    # ------------------------------------------------------------------ lines

    @staticmethod
    def _training(job: _Job) -> str:
        if job.train_status is None:
            return ""
        if job.train_status == "skipped":
            return f"already trained ({job.steps:,} steps)"
        text = (
            f"{job.steps:,}" + (f"/{job.total:,}" if job.total and job.steps < job.total else "") + " steps"
        )
        if job.trained and job.train_seconds:
            rate = job.trained / job.train_seconds if job.train_seconds > 0 else 0.0
            text += f" in {_clock(job.train_seconds)} ({rate:,.0f} steps/s)"
        if job.episode_return is not None:
            text += f", return {job.episode_return:.4g}"
        return text

    def _train_line(self, job: _Job, error: str | None) -> str:
        label = job.label.rstrip()
        if job.train_status == "failed":
            return f"{label}: training failed at step {job.steps:,}" + (f": {error}" if error else "")
        training = self._training(job)
        return f"{label}: {training}" if job.train_status == "skipped" else f"{label}: trained {training}"

    def _job_line(self, job: _Job, event: dict[str, Any]) -> str:
        tag = f"{job.batch.tag()} " if job.batch is not None and len(job.batch.ids) > 1 else ""
        label, training = job.label.rstrip(), self._training(job)
        if job.status == "done":
            return f"{tag}{label}: done in {_clock(event.get('seconds'))}" + (
                f"; {training}" if training else ""
            )
        if job.status == "failed":
            at = f" at step {job.steps:,}" if job.train_status is not None or job.steps else ""
            return f"{tag}{label}: failed after {_clock(event.get('seconds'))}{at}: {event.get('error', '')}"
        return f"{tag}{label}: {job.status}"

    def close(self) -> None:
        """Close every bar still open (a run that stopped)."""
        with self._lock:
            batches = {id(j.batch): j.batch for j in self.jobs.values() if j.batch is not None}
            for job in self.jobs.values():
                self._close_bar(job)
            for batch in batches.values():
                if batch.bar is not None:
                    batch.bar.close()
                    batch.bar = None


def terminal_board(stream: IO[str] | None = None) -> Board:
    """Return a board for ``stream`` (default: stderr): bars on a terminal, a line per finished job otherwise."""
    stream = stream or sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return Board("bars" if tty else "lines", stream=stream)


class Follower:
    """Tail an events file into a board from a daemon thread (from the file's current end)."""

    def __init__(self, path: str | Path, board: Board, every: float = POLL_SECONDS):
        self.reader, self.board, self.every = ProgressReader(path, from_end=True), board, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="rlq-progress", daemon=True)

    def _follow(self) -> None:
        while not self._stop.wait(self.every):
            self.poll()

    def poll(self) -> None:
        """Show the events written since the last poll."""
        for event in self.reader.read():
            self.board.handle(event)

    def start(self) -> Follower:
        """Return this follower after starting its thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following, show the last events and close the bars (safe to call when never started)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.poll()
        self.board.close()
