"""Argument checks shared by every layer: each returns the value it checked or raises ValueError naming it."""

from __future__ import annotations

import math
from numbers import Integral
from typing import Any


def check_positive_int(name: str, value: Any) -> int:
    """Return ``value`` as an int if it is a positive integer (NumPy's too; not a bool), else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def check_non_negative_int(name: str, value: Any) -> int:
    """Return ``value`` as an int if it is an integer >= 0 (NumPy's too; not a bool), else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def check_fraction(name: str, value: Any, *, low_open: bool = False, high_open: bool = False) -> float:
    """Return ``value`` as a float if it is a finite number in [0, 1] (ends open as asked), else raise."""
    low, high = "(" if low_open else "[", ")" if high_open else "]"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number in {low}0, 1{high}, got {value!r}")
    value = float(value)
    if value < 0 or value > 1 or (low_open and value == 0) or (high_open and value == 1):
        raise ValueError(f"{name} must be in {low}0, 1{high}, got {value!r}")
    return value
