"""Strict JSON for state files, checkpoints and run folders: plain values only, atomic writes."""

from __future__ import annotations

import json
import math
import os
from numbers import Integral, Real
from pathlib import Path
from typing import Any


def json_safe(value: Any, name: str = "value", strict: bool = False) -> Any:
    """Return ``value`` as plain JSON data: numpy scalars as int/float, NaN/inf as None, tuples as lists.

    Values of other types pass through unchanged, or raise TypeError naming ``name`` when ``strict``.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [json_safe(v, name, strict) for v in value]
    if isinstance(value, dict):
        return {str(k): json_safe(v, f"{name}.{k}", strict) for k, v in value.items()}
    if strict:
        raise TypeError(f"{name!r} is a {type(value).__name__}; use numbers, strings, lists or dicts")
    return value


def read_json(path: str | Path, what_to_do: str = "") -> dict[str, Any]:
    """Return the JSON object stored at ``path`` ({} when the file does not exist).

    A damaged file raises ValueError naming it, followed by ``what_to_do`` (e.g. which file to delete).
    """
    path = Path(path)
    if not path.exists():
        return {}
    advice = f"; {what_to_do}" if what_to_do else ""
    try:
        with open(path) as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is damaged: not valid JSON ({e}){advice}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is damaged: it does not hold a JSON object{advice}")
    return data


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON atomically (a crash never leaves half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:  # a full disk, say: no half-written temporary file stays beside the file
        tmp.unlink(missing_ok=True)
        raise
