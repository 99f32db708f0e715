"""Strict JSON for state files, checkpoints and run folders: plain values only, atomic writes."""

from __future__ import annotations

import json
import math
import os
import re
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


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _stable_name(value: Any) -> str:
    """Return a name of ``value`` that is the same in every process: a function's or class's qualified name,
    else its repr without memory addresses."""
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    return _ADDRESS.sub("", repr(value))


def plain_json(value: Any) -> Any:
    """Return ``value`` as plain JSON data (:func:`json_safe`), anything else JSON cannot hold as a stable name.

    Two processes building the same settings get equal values, so settings can be compared across runs.
    """
    return json.loads(json.dumps(json_safe(value), default=_stable_name))


def differences(saved: Any, now: Any, path: str = "") -> list[str]:
    """Return where two JSON values differ, one line each with both values, e.g. ``gst.s_shift: 0.25, now 1.0``.

    Dicts are compared key by key (``a.b``); lists of equal length item by item (``a[1]``).
    """
    if isinstance(saved, dict) and isinstance(now, dict):
        found = []
        for key in [*saved, *(k for k in now if k not in saved)]:
            where = f"{path}.{key}" if path else str(key)
            if key not in now:
                found.append(f"{where}: {saved[key]!r}, now unset")
            elif key not in saved:
                found.append(f"{where}: unset, now {now[key]!r}")
            else:
                found += differences(saved[key], now[key], where)
        return found
    if isinstance(saved, list) and isinstance(now, list) and len(saved) == len(now):
        return [
            d
            for i, (a, b) in enumerate(zip(saved, now, strict=True))
            for d in differences(a, b, f"{path}[{i}]")
        ]
    return [] if saved == now else [f"{path or 'value'}: {saved!r}, now {now!r}"]


def check_settings(path: str | Path, settings: dict[str, Any], advice: str = "") -> None:
    """Write ``settings`` (JSON data) to ``path`` the first time; after that, raise ValueError if they differ.

    The error names every difference (:func:`differences`) with the saved value and the new one, then
    ``advice`` (what to do instead).
    """
    path = Path(path)
    settings = plain_json(settings)
    if path.is_file():
        saved = read_json(path, what_to_do="delete it to record the settings anew")
        changed = differences(saved, settings)
        if changed:
            raise ValueError(
                f"{path.parent.name} was trained with other settings ({'; '.join(changed)}): resuming it "
                f"would mix two configurations.{' ' + advice if advice else ''} Folder: {path.parent}"
            )
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, settings)
