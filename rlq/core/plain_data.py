"""Results as data that cannot run code when read: JSON, with tagged objects for what JSON lacks.

:func:`to_data` turns a result built of ``None``, bools, ints, floats (NaN and infinities included), strings,
lists, tuples, dicts (any keys of these types), numpy scalars and arrays of numbers, bools or strings,
PyTorch tensors, pandas DataFrames and Series, and paths into plain JSON values; :func:`from_data` turns them
back (a numpy scalar as the Python number it holds). What JSON has no form for is written as an object
``{"__rlq__": <tag>, ...}``:

- ``float``: ``"nan"``, ``"inf"`` or ``"-inf"`` (standard JSON has no such numbers);
- ``tuple``, ``dict`` (a dict whose keys are not all strings, or that holds the key ``__rlq__``);
- ``ndarray`` (dtype, shape, the values in C order), ``tensor`` (the same, read back with ``torch.from_numpy``);
- ``dataframe`` and ``series`` (each column's name, dtype and values; the index when it is not ``0..n-1``);
- ``na`` (pandas' missing value), ``timestamp`` (ISO 8601), ``path``.

Reading builds only these types: a file is data, never code, unlike a pickle. Anything else raises
TypeError naming where in the value it is (``result['model']``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import pandas as pd

TAG = "__rlq__"
"""The key that marks an object standing for a value JSON has no form for."""
ARRAY_KINDS = "biufU"
"""numpy dtype kinds an array may have: bool, signed and unsigned int, float, string."""
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _float(value: float) -> Any:
    value = float(value)
    if math.isfinite(value):
        return value
    return {TAG: "float", "value": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}


def _array(value: np.ndarray, where: str) -> dict[str, Any]:
    if value.dtype.kind not in ARRAY_KINDS:
        raise TypeError(
            f"{where} is an array of dtype {value.dtype}; only numbers, bools and strings are data"
        )
    return {
        TAG: "ndarray",
        "dtype": value.dtype.str,
        "shape": list(value.shape),
        "data": [to_data(v, where) for v in value.reshape(-1).tolist()],
    }


def _tensor(value: Any, where: str) -> dict[str, Any]:
    return {TAG: "tensor", "array": _array(value.detach().cpu().numpy(), where)}


def _index(index: pd.Index, where: str) -> Any:
    if isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1:
        return None
    if isinstance(index, pd.MultiIndex):
        raise TypeError(f"{where} has a MultiIndex; reset it to columns first")
    return {"name": to_data(index.name, where), "values": to_data(index.tolist(), f"{where}.index")}


def _column(series: pd.Series, where: str) -> dict[str, Any]:
    inside = f"{where}[{series.name!r}]"
    return {
        "name": to_data(series.name, where),
        "dtype": str(series.dtype),
        "values": [to_data(v, inside) for v in series.tolist()],
    }


def _frame(value: pd.DataFrame, where: str) -> dict[str, Any]:
    if not value.columns.is_unique:
        raise TypeError(f"{where} has repeated column names")
    columns = [_column(value.iloc[:, i], where) for i in range(value.shape[1])]
    return {TAG: "dataframe", "length": len(value), "columns": columns, "index": _index(value.index, where)}


def _series(value: pd.Series, where: str) -> dict[str, Any]:
    return {TAG: "series", "column": _column(value, where), "index": _index(value.index, where)}


def _dict(value: dict, where: str) -> Any:
    if all(isinstance(k, str) for k in value) and TAG not in value:
        return {k: to_data(v, f"{where}[{k!r}]") for k, v in value.items()}
    return {
        TAG: "dict",
        "items": [[to_data(k, where), to_data(v, f"{where}[{k!r}]")] for k, v in value.items()],
    }


def _is_na(value: Any) -> bool:
    return value is pd.NA or value is pd.NaT


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and type(value).__name__ in ("Tensor", "Parameter")


_ENCODERS: list[tuple[Callable[[Any], bool], Callable[[Any, str], Any]]] = [
    (lambda v: v is None or isinstance(v, (bool, str)), lambda v, w: v),
    (lambda v: isinstance(v, (np.bool_,)), lambda v, w: bool(v)),
    (lambda v: isinstance(v, (int, np.integer)), lambda v, w: int(v)),
    (lambda v: isinstance(v, (float, np.floating)), lambda v, w: _float(v)),
    (lambda v: isinstance(v, list), lambda v, w: [to_data(x, f"{w}[{i}]") for i, x in enumerate(v)]),
    (lambda v: isinstance(v, tuple), lambda v, w: {TAG: "tuple", "items": to_data(list(v), w)}),
    (lambda v: isinstance(v, dict), _dict),
    (lambda v: isinstance(v, np.ndarray), _array),
    (_is_tensor, _tensor),
    (lambda v: isinstance(v, pd.DataFrame), _frame),
    (lambda v: isinstance(v, pd.Series), _series),
    (_is_na, lambda v, w: {TAG: "na"}),
    (lambda v: isinstance(v, pd.Timestamp), lambda v, w: {TAG: "timestamp", "value": v.isoformat()}),
    (lambda v: isinstance(v, PurePath), lambda v, w: {TAG: "path", "value": str(v)}),
]


def to_data(value: Any, where: str = "value") -> Any:
    """Return ``value`` as plain JSON values (see the module docstring); TypeError names what is not data."""
    for accepts, encode in _ENCODERS:
        if accepts(value):
            return encode(value, where)
    raise TypeError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which is not data: keep numbers, "
        "strings, lists, dicts, numpy arrays, tensors and DataFrames in a result"
    )


def _decode_array(obj: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(obj["dtype"])
    if dtype.kind not in ARRAY_KINDS:
        raise ValueError(f"an array of dtype {dtype} is not data")
    values = [from_data(v) for v in obj["data"]]
    return np.array(values, dtype=dtype).reshape(obj["shape"])


def _decode_index(obj: Any, length: int) -> pd.Index:
    if obj is None:
        return pd.RangeIndex(length)
    return pd.Index(from_data(obj["values"]), name=from_data(obj["name"]))


def _decode_column(obj: dict[str, Any]) -> pd.Series:
    values = [from_data(v) for v in obj["values"]]
    dtype = obj["dtype"]
    series = pd.Series(values, dtype=object if dtype == "object" else None, name=from_data(obj["name"]))
    return series if dtype in ("object", str(series.dtype)) else series.astype(dtype)


def _decode_frame(obj: dict[str, Any]) -> pd.DataFrame:
    columns = [_decode_column(c) for c in obj["columns"]]
    length = int(obj["length"])
    frame = pd.concat(columns, axis=1) if columns else pd.DataFrame(index=pd.RangeIndex(length))
    if columns:
        frame.columns = [c.name for c in columns]  # concat would turn a None name into 0, 1, ...
    frame.index = _decode_index(obj["index"], length)
    return frame


def _decode_series(obj: dict[str, Any]) -> pd.Series:
    series = _decode_column(obj["column"])
    series.index = _decode_index(obj["index"], len(series))
    return series


def _decode_tensor(obj: dict[str, Any]) -> Any:
    import torch

    return torch.from_numpy(_decode_array(obj["array"]).copy())


_DECODERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "float": lambda o: _NONFINITE[o["value"]],
    "tuple": lambda o: tuple(from_data(o["items"])),
    "dict": lambda o: {from_data(k): from_data(v) for k, v in o["items"]},
    "ndarray": _decode_array,
    "tensor": _decode_tensor,
    "dataframe": _decode_frame,
    "series": _decode_series,
    "na": lambda o: pd.NA,
    "timestamp": lambda o: pd.Timestamp(o["value"]),
    "path": lambda o: Path(o["value"]),
}


def from_data(obj: Any) -> Any:
    """Return the value :func:`to_data` turned into ``obj``; ValueError for a tag it does not know."""
    if isinstance(obj, list):
        return [from_data(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if TAG not in obj:
        return {k: from_data(v) for k, v in obj.items()}
    decode = _DECODERS.get(obj[TAG])
    if decode is None:
        raise ValueError(f"unknown tag {obj[TAG]!r}: not written by rlq.core.plain_data")
    return decode(obj)


def write_data(path: str | os.PathLike, value: Any, where: str = "value") -> None:
    """Write ``value`` (:func:`to_data`) as JSON at ``path`` atomically: a crash never leaves half a file."""
    path = Path(path)
    text = json.dumps(to_data(value, where), allow_nan=False, separators=(",", ":"))
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text + "\n")
        os.replace(tmp, path)
    except BaseException:  # a full disk, say: no half-written temporary file stays beside the file
        tmp.unlink(missing_ok=True)
        raise


def read_data(path: str | os.PathLike) -> Any:
    """Return the value :func:`write_data` wrote at ``path``; ValueError naming the file when it is damaged."""
    path = Path(path)
    try:
        return from_data(json.loads(path.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is damaged: not data rlq wrote ({type(e).__name__}: {e})") from None
