"""Latency measurement and the choice of the fastest inference backend for a policy, by measurement."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from rlq.core.validation import check_non_negative_int, check_positive_int
from rlq.quant.onnx_backend import OnnxPolicy, export_onnx
from rlq.quant.ptq import Calibration, ptq
from rlq.quant.quantizable import has_convolutions

BACKENDS = ("torch-fp32", "torch-int8", "onnx-fp32", "onnx-int8")
"""Inference backends that :func:`compare_backends` can build: PyTorch eager and ONNX Runtime, fp32 and int8."""


def measure_latency(
    fn: Callable[[Any], Any], x: Any, repeats: int = 100, warmup: int = 10
) -> dict[str, float]:
    """Return the median and 90th-percentile wall time of ``fn(x)`` in microseconds (``median_us``, ``p90_us``).

    ``warmup`` calls run first and are not timed; each of the ``repeats`` calls is timed on its own.
    """
    check_positive_int("repeats", repeats)
    check_non_negative_int("warmup", warmup)
    for _ in range(warmup):
        fn(x)
    times_ns = np.empty(repeats, dtype=np.float64)
    for i in range(repeats):
        start = time.perf_counter_ns()
        fn(x)
        times_ns[i] = time.perf_counter_ns() - start
    return {"median_us": float(np.median(times_ns)) / 1e3, "p90_us": float(np.percentile(times_ns, 90)) / 1e3}


def measure_interleaved(
    calls: Mapping[str, tuple[Callable[[Any], Any], Any]],
    repeats: int = 100,
    rounds: int = 5,
    warmup: int = 10,
) -> dict[str, dict[str, float]]:
    """Return :func:`measure_latency`'s numbers of every ``name: (fn, x)`` in ``calls``, measured side by side.

    On a shared machine timings drift with the load, so the calls take turns: ``rounds`` rounds, each running
    every call ``warmup`` times untimed and then ``repeats`` times timed, under ``torch.inference_mode``. The
    median and 90th percentile are over all of a call's timed runs; ratios of calls measured together are what
    to compare.
    """
    check_positive_int("repeats", repeats)
    check_positive_int("rounds", rounds)
    check_non_negative_int("warmup", warmup)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, (fn, x) in calls.items():
            with torch.inference_mode():
                for _ in range(warmup):
                    fn(x)
                for _ in range(repeats):
                    start = time.perf_counter_ns()
                    fn(x)
                    times[name].append((time.perf_counter_ns() - start) / 1e3)
    return {
        name: {"median_us": float(np.median(t)), "p90_us": float(np.percentile(t, 90))}
        for name, t in times.items()
    }


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Yield with PyTorch's intra-op thread count set to ``threads``; restore it afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build_backend(
    module: nn.Module,
    example_input: Tensor,
    backend: str,
    workdir: str | Path,
    calibration: Calibration | None = None,
    threads: int = 1,
) -> Callable[[Any], Any]:
    """Return ``module`` made into a callable on ``backend`` (one of :data:`BACKENDS`), files under ``workdir``.

    Torch backends take torch tensors, ONNX backends NumPy arrays. int8 needs calibration data only for
    models with convolutions (static quantization); ``example_input`` is used when none is given.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    static = has_convolutions(module)
    calibration = (example_input if calibration is None else calibration) if static else None
    if backend == "torch-fp32":
        return ptq(module, "fp32")
    if backend == "torch-int8":
        return ptq(module, "int8", calibration=calibration)
    precision = backend.removeprefix("onnx-")
    path = Path(workdir) / f"{backend}.onnx"
    export_onnx(module, path, example_input, precision, calibration=calibration, overwrite=True)
    return OnnxPolicy(path, threads=threads)


def compare_backends(
    module: nn.Module,
    example_input: Tensor | np.ndarray,
    candidates: Sequence[str] = BACKENDS,
    *,
    calibration: Calibration | None = None,
    threads: int = 1,
    repeats: int = 100,
    warmup: int = 10,
) -> dict[str, dict[str, float]]:
    """Return :func:`measure_latency` of ``module`` on each backend in ``candidates``, for ``example_input``.

    Each backend runs with ``threads`` threads (PyTorch's count is restored afterwards), torch backends under
    ``torch.inference_mode`` on a tensor, ONNX Runtime on a NumPy array, measured one after the other in one
    process. ``module`` itself is not changed.
    """
    if isinstance(candidates, str) or not candidates:
        raise ValueError(
            f"candidates must be a non-empty sequence of backend names from {', '.join(BACKENDS)}"
        )
    unknown = [c for c in candidates if c not in BACKENDS]
    if unknown:
        raise ValueError(f"unknown backend(s) {unknown}; choose from {', '.join(BACKENDS)}")
    check_positive_int("threads", threads)
    example = torch.as_tensor(example_input).float()
    array = example.numpy()
    results = {}
    with tempfile.TemporaryDirectory(prefix="rlq-backends-") as workdir, torch_threads(threads):
        for backend in candidates:
            fn = build_backend(module, example, backend, workdir, calibration=calibration, threads=threads)
            if backend.startswith("torch"):
                with torch.inference_mode():
                    results[backend] = measure_latency(fn, example, repeats=repeats, warmup=warmup)
            else:
                results[backend] = measure_latency(fn, array, repeats=repeats, warmup=warmup)
    return results


def fastest_backend(
    module: nn.Module,
    example_input: Tensor | np.ndarray,
    candidates: Sequence[str] = BACKENDS,
    **kwargs: Any,
) -> str:
    """Return the name of the backend in ``candidates`` with the lowest median latency on ``example_input``.

    Keyword arguments go to :func:`compare_backends`. The choice is by speed alone: check the int8 policy's
    return (e.g. with ``rlq.rl.evaluate``) before acting with it.
    """
    timings = compare_backends(module, example_input, candidates, **kwargs)
    return min(timings, key=lambda name: timings[name]["median_us"])
