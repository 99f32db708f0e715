"""Which ``R x K`` blocks of a 2-D array hold a nonzero entry, and back: shared by bit counting and the runtime."""

from __future__ import annotations

import numpy as np


def kept_blocks(nonzero: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """Return the bool ``(ceil(out / R), ceil(in / K))`` map of the blocks of 2-D ``nonzero`` holding a True entry.

    Edge blocks that ``block`` does not fit are padded with False.
    """
    rows, cols = block
    out, inp = nonzero.shape
    padded = np.zeros((-(-out // rows) * rows, -(-inp // cols) * cols), bool)
    padded[:out, :inp] = nonzero
    return padded.reshape(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols).any(axis=(1, 3))


def expand_kept_blocks(kept: np.ndarray, block: tuple[int, int], shape: tuple[int, int]) -> np.ndarray:
    """Return the bool 2-D entry map of ``shape`` whose ``block``-shaped blocks ``kept`` marks (edge blocks cropped)."""
    rows, cols = block
    return np.repeat(np.repeat(kept, rows, axis=0), cols, axis=1)[: shape[0], : shape[1]]
