"""Check a written export against the policy it was written from, on observations the user gives.

:func:`check_export` runs the files :func:`rlq.deploy.export_policy` wrote (the C function built for this
machine by :func:`rlq.deploy.load_c_policy`, or the ONNX model in ONNX Runtime) on the observations and
compares their actions, one :class:`Comparison` each:

- with the PyTorch policy's deterministic actions (SB3's ``predict``; an ``nn.Module`` actor's forward with
  its action space's post-processing): at fp32 within :data:`rlq.deploy.FP32_RTOL` of the action bound, the
  same action in a discrete space; a C file at int8 and below within :func:`rlq.deploy.error_bound`, the
  worst case of its quantization, entry by entry (a discrete action is counted, not held to a tolerance:
  the bound is on the values it takes the argmax of);
- a C file at int8 and below also with rlq's forward of the same codes (:func:`rlq.deploy.compile_policy`
  with the same calibration): within :data:`rlq.deploy.SAME_CODES_RTOL` of the action bound, the same
  discrete action wherever that forward's top two values are not tied. One changed weight code fails it.

An ONNX model at int8 is ONNX Runtime's quantization, not rlq's: it is compared without a tolerance. A
tolerance not met means the file does not compute what its policy does: :attr:`ExportCheck.ok` is False.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlq.deploy.bounds import FP32_RTOL, SAME_CODES_RTOL, error_bound, parity
from rlq.deploy.c_build import load_c_policy
from rlq.deploy.export import acting_module, exported_policy, load_policy_source, takes_action_space
from rlq.deploy.export_c import CExport
from rlq.deploy.reader import read_policy

TIE = 1e-4
"""Output values closer than this are tied: another summation order may take the other as the argmax."""


@dataclass(frozen=True)
class Comparison:
    """The export's actions against one reference's on the checked observations."""

    export: str
    reference: str
    max_difference: float
    """The largest absolute difference of an action entry (discrete: of an action index)."""
    mean_difference: float
    """The mean absolute difference over every action entry."""
    states_within: float
    """The share of states whose every action entry is within the tolerance (discrete: the same action)."""
    states: int
    tolerance: float | None
    """The largest tolerance of an entry; None: compared, not held to one."""
    within: bool
    allows: str
    """What the tolerance allows for."""
    discrete: bool

    def line(self) -> str:
        """Return the comparison in one line."""
        what = f"{self.export} against {self.reference}: "
        if self.discrete:
            what += f"the same action on {self.states_within:.1%} of {self.states:,} states"
        else:
            what += f"largest difference {self.max_difference:.3g} (mean {self.mean_difference:.3g})"
        if self.tolerance is None:
            return f"{what} ({self.allows}: no tolerance)"
        shown = "" if self.discrete else f" ({self.tolerance:.3g})"
        return f"{what}, {'within' if self.within else 'NOT within'} {self.allows}{shown}"


@dataclass(frozen=True)
class ExportCheck:
    """What :func:`check_export` compared, on how many observations."""

    comparisons: list[Comparison]
    observations: int

    @property
    def ok(self) -> bool:
        """Return whether every comparison held to a tolerance is within it."""
        return all(c.within for c in self.comparisons if c.tolerance is not None)


@dataclass(frozen=True)
class _Actions:
    """The export's and PyTorch's actions on the observations, and what the tolerances scale with."""

    label: str
    actions: np.ndarray
    pytorch: np.ndarray
    pytorch_name: str
    high: float
    """The largest action magnitude: a Box's bound, else the actions'."""

    @property
    def discrete(self) -> bool:
        return not np.issubdtype(self.pytorch.dtype, np.floating)

    def compare(
        self, reference: str, expected: np.ndarray, tolerance: Any, allows: str, subset: Any = slice(None)
    ) -> Comparison:
        actions, expected = self.actions[subset], expected[subset]
        tolerance = tolerance[subset] if isinstance(tolerance, np.ndarray) else tolerance
        result = parity(actions, expected, 0.0 if tolerance is None else tolerance)
        mean = float(np.abs(actions.astype(np.float64) - expected).mean()) if expected.size else 0.0
        return Comparison(
            self.label, reference, result["max |difference|"], mean, result["states within"], len(expected),
            None if tolerance is None else result["tolerance"], tolerance is None or result["within"], allows,
            self.discrete,
        )  # fmt: skip


def check_export(
    export: CExport | str | Path,
    source: Any,
    observations: np.ndarray,
    precision: str = "fp32",
    *,
    action_space: Any = None,
    calibration: np.ndarray | None = None,
) -> ExportCheck:
    """Compare what ``export`` computes with the policy ``source`` on ``observations`` (the module docstring).

    ``export``: what :func:`rlq.deploy.export_policy` returned (a C export or its folder, or the ``.onnx``
    path); ``source``, ``precision``, ``action_space`` and ``calibration``: what that export was given.
    ``observations``: finite, ``(n, obs_dim)``, as the network's first layer takes them.
    """
    policy = load_policy_source(source)
    takes_action_space(policy, action_space)  # refuses an actor without its space, an SB3 model given one
    obs = check_observations(observations, read_policy(policy)[0][0].n_in)
    run = _run(export, policy, action_space, obs, precision)
    if precision == "fp32":
        tolerance = 0.0 if run.discrete else FP32_RTOL * run.high
        return ExportCheck(
            [run.compare(run.pytorch_name, run.pytorch, tolerance, "float32 rounding")], len(obs)
        )
    if run.label.startswith("ONNX"):
        return ExportCheck(
            [run.compare(run.pytorch_name, run.pytorch, None, "ONNX Runtime's int8")], len(obs)
        )
    compiled = exported_policy(policy, precision, action_space, calibration)
    same = compiled(obs).reshape(run.pytorch.shape)
    if run.discrete:
        top2 = np.sort(compiled.outputs(obs), axis=1)[:, -2:]
        untied = top2[:, 1] - top2[:, 0] > TIE
        comparisons = [
            run.compare("rlq's forward of the same codes", same, 0.0, "untied states", untied),
            run.compare(run.pytorch_name, run.pytorch, None, f"{precision} flips close actions"),
        ]
    else:
        _, bound = error_bound(policy, compiled, obs)
        # the bound is on the distance from the float64 forward; PyTorch's float32 forward adds its rounding
        bound = bound.reshape(run.pytorch.shape) + FP32_RTOL * run.high
        comparisons = [
            run.compare(
                "rlq's forward of the same codes", same, SAME_CODES_RTOL * run.high, "summation order"
            ),
            run.compare(run.pytorch_name, run.pytorch, bound, f"the {precision} worst-case bound"),
        ]
    return ExportCheck(comparisons, len(obs))


def check_observations(observations: Any, obs_dim: int) -> np.ndarray:
    """Return ``observations`` as a contiguous float32 ``(n, obs_dim)`` array; raise ValueError naming the problem."""
    obs = np.asarray(observations)
    if obs.ndim != 2 or obs.shape[1] != obs_dim or len(obs) == 0:
        raise ValueError(f"check observations must have shape (n, {obs_dim}) with n >= 1, got {obs.shape}")
    if not np.issubdtype(obs.dtype, np.number) or not np.isfinite(obs).all():
        raise ValueError("check observations must be finite numbers")
    return np.ascontiguousarray(obs, np.float32)


def _run(
    export: CExport | str | Path, policy: Any, action_space: Any, obs: np.ndarray, precision: str
) -> _Actions:
    """Return the export's and PyTorch's actions on ``obs``."""
    if hasattr(policy, "predict"):
        pytorch, _ = policy.predict(obs, deterministic=True)
        name = "PyTorch fp32 (SB3 predict)"
    else:
        with torch.no_grad():
            pytorch = acting_module(policy, action_space)(torch.from_numpy(obs)).numpy()
        name = "PyTorch fp32"
    pytorch = np.asarray(pytorch)
    onnx = isinstance(export, (str, Path)) and Path(export).suffix == ".onnx"
    if onnx:
        from rlq.quant import OnnxPolicy

        actions = np.asarray(OnnxPolicy(export)(obs))
    else:
        actions = load_c_policy(export)(obs)
    actions = actions.reshape(pytorch.shape).astype(pytorch.dtype)
    space = action_space if action_space is not None else getattr(policy, "action_space", None)
    high = getattr(space, "high", None)
    if high is None or not np.isfinite(high).all():
        high = np.abs(pytorch).max() if pytorch.size else 1.0
    return _Actions(
        f"{'ONNX' if onnx else 'C'} {precision}", actions, pytorch, name, float(np.abs(high).max())
    )
