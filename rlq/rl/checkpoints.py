"""Checkpoints of an SB3 training: written atomically every N steps, the newest few kept, found again on resume.

A checkpoint at ``<steps>`` is ``model_<steps>_steps.zip`` with ``curve_<steps>_steps.csv`` (the learning
curve so far), ``state_<steps>_steps.json`` (wall time and the state of stateful callbacks) and, for an
off-policy algorithm, ``replay_<steps>_steps.pkl``. The model is written last: its presence marks the
checkpoint complete. The newest ``keep`` checkpoints are kept (:data:`KEEP_CHECKPOINTS` by default), and the
replay buffers of the newest two only (:data:`REPLAY_BUFFERS_KEPT`; each is as large as the buffer), so when
the newest checkpoint is damaged the one before it still resumes with its buffer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from stable_baselines3.common.callbacks import BaseCallback

from rlq.core.jsonio import write_json
from rlq.core.validation import check_positive_int

log = logging.getLogger(__name__)
T = TypeVar("T")
KEEP_CHECKPOINTS = 3
"""How many checkpoints a training keeps by default, the newest ones."""
REPLAY_BUFFERS_KEPT = 2
"""How many of the newest checkpoints keep their replay buffer: the newest and the one before it."""
_CKPT = re.compile(r"(model|curve|state|replay)_(\d+)_steps\.(zip|csv|json|pkl)$")
_PARTS = ("model_{}_steps.zip", "curve_{}_steps.csv", "state_{}_steps.json", "replay_{}_steps.pkl")


def _steps_of(folder: Path, kind: str) -> list[int]:
    """Return the steps of ``folder``'s files of ``kind`` (``model``, ``replay``, ...), oldest first."""
    found = (_CKPT.fullmatch(p.name) for p in folder.glob(f"{kind}_*_steps.*"))
    return sorted(int(m.group(2)) for m in found if m and m.group(1) == kind)


def _missing(folder: Path, steps: int, buffers: bool) -> list[str]:
    needed = _PARTS[1:] if buffers else _PARTS[1:3]
    return [name.format(steps) for name in needed if not (folder / name.format(steps)).exists()]


def latest_checkpoint(folder: str | Path, before: int | None = None) -> tuple[int, Path] | None:
    """Return ``(timesteps, path)`` of the newest complete checkpoint in ``folder`` (older than ``before``), or None.

    Complete: its model, curve and state files exist, and its replay buffer too where the folder holds
    replay buffers (an off-policy run). A newer checkpoint that lacks one of them (moved away, deleted, or
    past the newest two that keep a buffer) is named in a warning and passed over.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    buffers = bool(_steps_of(folder, "replay"))
    models = [s for s in _steps_of(folder, "model") if before is None or s < before]
    complete = [s for s in models if not _missing(folder, s, buffers)]
    newest = max(complete) if complete else None
    newer = [s for s in models if newest is None or s > newest]
    if newer:
        log.warning(
            "%s: the checkpoint at %d steps lacks %s; resuming from %s",
            folder, max(newer), " and ".join(_missing(folder, max(newer), buffers)),
            f"the checkpoint at {newest} steps" if newest is not None else "step 0: no checkpoint is complete",
        )  # fmt: skip
    return (newest, folder / _PARTS[0].format(newest)) if newest is not None else None


def move_away_advice(folder: Path, steps: int) -> str:
    """Return what to move out of ``folder`` when the checkpoint at ``steps`` is damaged, and what that resumes from."""
    names = [name.format(steps) for name in _PARTS if (folder / name.format(steps)).exists()]
    found = latest_checkpoint(folder, before=steps)
    with_buffer = bool(_steps_of(folder, "replay"))
    if found is None:
        then = "training then starts again from step 0, as no earlier checkpoint is complete" + (
            " with its replay buffer" if with_buffer else ""
        )
    else:
        then = f"training then resumes from the checkpoint at {found[0]} steps" + (
            ", its replay buffer included" if with_buffer else ""
        )
    return f"Move {', '.join(names)} out of {folder}: {then}."


def load_newest_checkpoint(folder: str | Path, load: Callable[[Path], T]) -> tuple[int, T]:
    """Return ``(timesteps, load(model file))`` of the newest complete checkpoint in ``folder`` that loads.

    A newer checkpoint whose model cannot be loaded (truncated, damaged, foreign) is named in a warning with
    the error and passed over for the one before it. FileNotFoundError when ``folder`` holds no complete
    checkpoint; ValueError naming the newest one's error and what to do when none of them loads.
    """
    folder = Path(folder)
    errors: list[str] = []
    found = latest_checkpoint(folder)
    while found is not None:
        steps, path = found
        try:
            return steps, load(path)
        except Exception as e:  # any unreadable model: the one before it may load
            first = (str(e).strip().splitlines() or [""])[0]
            error = (
                first.replace(str(path), path.name)
                if str(path) in first
                else f"{path.name}: {type(e).__name__}: {first}"
            )
            errors.append(error)
            found = latest_checkpoint(folder, before=steps)
            log.warning(
                "%s: the checkpoint cannot be loaded (%s); %s", folder, error,
                f"using the checkpoint at {found[0]} steps instead" if found else "no earlier checkpoint is complete",
            )  # fmt: skip
    if not errors:
        raise FileNotFoundError(f"{folder} holds no complete checkpoint")
    raise ValueError(
        f"none of the {len(errors)} checkpoints in {folder} can be loaded (newest: {errors[0]}); their files are "
        "damaged: copy the run folder again from where it was trained, or train it again"
    )


class Checkpointer(BaseCallback):
    """Every ``every`` timesteps save model, learning curve and (off-policy) replay buffer, atomically.

    The newest ``keep`` checkpoints stay and, of those, the newest two keep their replay buffer; older files
    are deleted once the new model is in place. ``save_model(model, path)`` replaces ``model.save(path)``
    (e.g. :func:`rlq.sb3.checkpoint.save_compressed` for compressed policies); the state of ``stateful``
    callbacks (``{checkpoint_key: callback}``) is kept in the checkpoint's ``state_<steps>_steps.json``.
    """

    def __init__(
        self,
        folder: Path,
        every: int,
        recorder: Any,
        save_model: Callable[[Any, Path], Any] | None = None,
        stateful: dict[str, Any] | None = None,
        keep: int = KEEP_CHECKPOINTS,
    ):
        super().__init__()
        self.folder, self.every, self.recorder = Path(folder), int(every), recorder
        self.save_model, self.stateful = save_model, dict(stateful or {})
        self.keep = check_positive_int("keep", keep)
        self._last = 0

    def _on_training_start(self) -> None:
        self._last = self.num_timesteps

    def _on_step(self) -> bool:
        if self.every > 0 and self.num_timesteps - self._last >= self.every:
            self.save()
        return True

    def save(self) -> Path:
        """Return the path of a checkpoint written now (older ones beyond the kept ones deleted after it)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        steps = self.num_timesteps
        target = self.folder / _PARTS[0].format(steps)
        tmp_model = self.folder / f".tmp_model_{steps}.zip"
        if self.save_model is None:
            self.model.save(tmp_model)
        else:
            self.save_model(self.model, tmp_model)
        if getattr(self.model, "replay_buffer", None) is not None:
            tmp_buf = self.folder / f".tmp_replay_{steps}.pkl"
            self.model.save_replay_buffer(tmp_buf)
            tmp_buf.replace(self.folder / _PARTS[3].format(steps))
        tmp_curve = self.folder / f".tmp_curve_{steps}.csv"
        self.recorder.frame().to_csv(tmp_curve, index=False)
        tmp_curve.replace(self.folder / _PARTS[1].format(steps))
        state: dict[str, Any] = {"timesteps": steps, "wall_time_s": self.recorder.wall_time()}
        if self.stateful:
            state["callbacks"] = {key: cb.state_dict() for key, cb in self.stateful.items()}
        write_json(self.folder / _PARTS[2].format(steps), state)
        tmp_model.replace(target)  # the model last: its presence marks the checkpoint complete
        prune_checkpoints(self.folder, self.keep)
        self._last = steps
        return target


def prune_checkpoints(folder: Path, keep: int = KEEP_CHECKPOINTS) -> None:
    """Delete every checkpoint file of ``folder`` but the newest ``keep`` checkpoints' and, of their replay
    buffers, all but the newest :data:`REPLAY_BUFFERS_KEPT`' (models first, so no half-deleted one is taken
    as complete)."""
    kept = _steps_of(folder, "model")[-keep:]
    buffered = set(kept[-REPLAY_BUFFERS_KEPT:])
    for kind, allowed in (
        ("model", set(kept)),
        ("curve", set(kept)),
        ("state", set(kept)),
        ("replay", buffered),
    ):
        for steps in _steps_of(folder, kind):
            if steps not in allowed:
                (folder / next(p for p in _PARTS if p.startswith(kind)).format(steps)).unlink(missing_ok=True)
