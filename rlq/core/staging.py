"""A new folder that appears whole or not at all: written in a hidden staging folder beside it, then renamed."""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STAGING_PREFIX = ".rlq-staging-"
"""How a staging folder's name starts: ``.rlq-staging-<pid>-<random>``, beside the folder it becomes."""
_STAGING = re.compile(re.escape(STAGING_PREFIX) + r"(\d+)-")


@contextmanager
def staged_folder(out: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty staging folder that is renamed to ``out`` when the block ends without an error.

    ``out`` must not exist (FileExistsError). Its missing parent folders are made. A block that raises (a full
    disk, Ctrl-C, SIGTERM turned into KeyboardInterrupt) removes the staging folder and the parent folders
    this call made, so nothing is left; a staging folder left by a killed process (its process gone) is removed
    by the next call in the same parent. A reader never sees ``out`` half written: it appears by one rename.
    """
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; write into a new folder")
    made = _make_parents(out.parent)
    try:
        remove_stale_staging(out.parent)
        staging = out.parent / f"{STAGING_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        staging.mkdir()  # the umask's mode, as the folder it becomes would have had
    except BaseException:
        _remove_empty(made)
        raise
    try:
        yield staging
        if out.exists():  # made while the files were written: rename would replace an empty folder silently
            raise FileExistsError(f"{out} appeared while it was written; nothing was replaced")
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty(made)
        raise


def remove_stale_staging(parent: Path) -> None:
    """Remove the staging folders in ``parent`` whose process has ended (killed while it wrote them)."""
    for path in parent.glob(f"{STAGING_PREFIX}*"):
        match = _STAGING.match(path.name)
        if match and path.is_dir() and not _process_alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _make_parents(folder: Path) -> list[Path]:
    """Return the folders made so that ``folder`` exists, outermost first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    made = []
    try:
        for path in reversed(missing):
            path.mkdir()
            made.append(path)
    except BaseException:
        _remove_empty(made)
        raise
    return made


def _remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (outermost first) where they are still empty, innermost first."""
    for path in reversed(folders):
        try:
            path.rmdir()
        except OSError:
            return
