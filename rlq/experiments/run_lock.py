"""One writer per run folder: an exclusive lock that ``rlq run`` and ``rlq run --resume`` hold while they work.

Two processes resuming the same folder would overwrite each other's checkpoints, archive the same attempt
twice and add up their training times. The lock is ``fcntl.flock`` on ``<run folder>/.lock``: the kernel
releases it when its holder exits, however it exits, so a killed run never leaves a stale lock behind. The
file names the holder (pid and host) for the message the second process gets.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlq.experiments.registry import ExperimentError

LOCK_FILE = ".lock"


class RunFolderBusy(ExperimentError):
    """Another process holds the run folder's lock (``rlq`` exits 2 naming it)."""


def _acquire(path: Path) -> int:
    """Return the descriptor of ``path``'s lock file after locking it, or raise :class:`RunFolderBusy`."""
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise RunFolderBusy(
            f"run folder {path} is still running (in use by {holder}); wait for it to end, or stop it, before "
            "resuming it"
        ) from None
    try:  # the holder's name is for the message a second process gets; the lock holds without it
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on host {socket.gethostname()}".encode())
    except OSError:
        pass
    return fd


@contextmanager
def run_folder_lock(path: str | Path) -> Iterator[None]:
    """Hold the exclusive lock of run folder ``path`` for the block, or raise :class:`RunFolderBusy` naming its holder."""
    fd = _acquire(Path(path))
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def hold_run_folder(path: str | Path) -> None:
    """Lock run folder ``path`` until this process ends (a JupyterLab kernel's own run folder)."""
    _HELD.append(_acquire(Path(path)))


_HELD: list[int] = []
