"""The claims specification: every claim of both papers, its metric, estimator, threshold and seeds.

``data/claims.csv`` declares, one row per claim and metric version, what the report judges: the paper row the
claim answers (``paper``, ``paper_experiment``, ``paper_metric`` in ``data/paper/``), the experiment and the
presets that measure it, the table and column our number is computed from (``table``, ``rows``, ``by``,
``column``, ``method``, ``reference``, ``scale``), the estimator, the name the notebook records it under
(``estimate``), the threshold as an expression of the paper's value, the minimum number of seeds (or seed
pairs), the task's maximum score where a reward can saturate (``ceiling``) and a condition on the run's setting
that the paper's claim needs (``requires``, e.g. ``dataset=cifar10``).

A claim whose metric changed after results existed keeps its earlier version as a ``superseded`` row: the
report judges it beside the ``current`` one, with both numbers. The file is written before the runs it judges,
and a test holds every published run to it (:mod:`rlq.claims.measure`).
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

from rlq.experiments.paths import data_dir

ESTIMATORS = (
    "iqm",
    "paired_difference",
    "paired_difference_common",
    "paired_difference_neg",
    "paired_iqm_drop",
    "unpaired_iqm_drop",
    "paired_change_pct",
    "paired_ratio",
    "recorded",
    "joint",
)
"""How a claim's number is estimated over seeds (:func:`rlq.claims.measure.measure`)."""

FAMILIES = (
    "GST compression",
    "GST reward",
    "GST joint",
    "GST classification",
    "QuaRL reward and bits",
    "ActorQ speedup",
)
"""Claim families: the report draws one figure per family, every claim in it in its own unit."""

STATUSES = ("current", "superseded")
_THRESHOLD = re.compile(r"^paper(?:\s*([+-])\s*(\d+(?:\.\d+)?))?$")


@dataclass(frozen=True)
class ClaimSpec:
    """One row of the claims specification (``data/claims.csv``)."""

    id: str
    label: str
    """The claim in words, e.g. ``TD3 HalfCheetah: reward drop against dense``."""
    version: int
    status: str
    family: str
    paper: str
    paper_experiment: str
    paper_metric: str
    experiment: str
    presets: tuple[str, ...]
    """The presets that measure the claim, from the shortest budget to the longest."""
    table: str
    rows: tuple[tuple[str, str], ...]
    by: str
    estimator: str
    column: str
    method: str
    reference: str
    scale: float
    unit: str
    estimate: str
    window: str
    direction: str
    threshold: str
    min_seeds: int
    ceiling: float | None
    requires: tuple[tuple[str, str], ...]
    paper_setting: str
    parts: tuple[str, ...]

    @property
    def key(self) -> str:
        """Return the claim's id with its metric version, e.g. ``gst_td3_reward@2``."""
        return f"{self.id}@{self.version}"

    @property
    def current(self) -> bool:
        """Return True for the metric the claim is judged by now (False: an earlier, superseded metric)."""
        return self.status == "current"

    def limit(self, paper_value: float) -> float:
        """Return the threshold our interval is judged against, from the paper's value."""
        sign, offset = _THRESHOLD.match(self.threshold).groups()  # type: ignore[union-attr]
        delta = float(offset or 0.0)
        return float(paper_value) + (delta if sign == "+" else -delta)


def key_value_pairs(text: str, what: str, where: str) -> tuple[tuple[str, str], ...]:
    """Return the ``key=value`` items of ``text`` (``;``-separated) as pairs; raise naming ``where`` (a file
    and its line) and ``what`` (the field) when an item is not ``key=value``."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(";"))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{where}: {what} {item!r} is not key=value")
        out.append((key.strip(), value.strip()))
    return tuple(out)


def _pairs(text: str, what: str, line: int) -> tuple[tuple[str, str], ...]:
    return key_value_pairs(text, what, f"claims.csv line {line}")


_CHOICES = (("estimator", ESTIMATORS), ("status", STATUSES), ("family", FAMILIES))


def _check_fields(raw: dict[str, str], bad: Callable[[str, str], ValueError]) -> None:
    """Raise ``bad(field, why)`` for the first field of ``raw`` the specification does not allow."""
    for name, allowed in _CHOICES:
        if raw[name] not in allowed:
            raise bad(name, f"is not one of {', '.join(allowed)}")
    joint = raw["estimator"] == "joint"
    if joint != bool(raw["parts"].strip()):
        raise bad("parts", "must name the claims a joint claim joins, and only a joint claim has parts")
    if joint:
        return
    if raw["direction"] not in (">=", "<="):
        raise bad("direction", "is not >= or <=")
    if not _THRESHOLD.match(raw["threshold"].strip()):
        raise bad("threshold", "is not 'paper', 'paper + X' or 'paper - X'")
    if not raw["estimate"].strip():
        raise bad("estimate", "is empty: name the estimate the notebook records")
    if raw["estimator"] != "recorded" and not (raw["table"] and raw["column"] and raw["method"]):
        raise bad("table", "and column and method are needed to compute the estimate from the run's table")


def _row(raw: dict[str, str], line: int) -> ClaimSpec:
    """Return one checked row of the specification; raise naming the line and the field that is wrong."""
    names = [f.name for f in fields(ClaimSpec)]
    missing = [n for n in names if n not in raw]
    if missing:
        raise ValueError(f"claims.csv lacks the column(s) {missing}")

    def bad(field: str, why: str) -> ValueError:
        return ValueError(f"claims.csv line {line} ({raw.get('id')!r}): {field} {raw.get(field)!r} {why}")

    _check_fields(raw, bad)
    try:
        version, min_seeds = int(raw["version"]), int(raw["min_seeds"])
        scale = float(raw["scale"]) if raw["scale"].strip() else 1.0
        ceiling = float(raw["ceiling"]) if raw["ceiling"].strip() else None
    except ValueError as err:
        raise ValueError(f"claims.csv line {line} ({raw.get('id')!r}): {err}") from err
    if min_seeds < 1 or not math.isfinite(scale):
        raise bad("min_seeds", "must be a positive integer (and scale a finite number)")
    presets = tuple(p for p in raw["presets"].split("|") if p)
    if not presets:
        raise bad("presets", "names no preset")
    return ClaimSpec(
        id=raw["id"], label=raw["label"], version=version, status=raw["status"], family=raw["family"], paper=raw["paper"],
        paper_experiment=raw["paper_experiment"], paper_metric=raw["paper_metric"], experiment=raw["experiment"],
        presets=presets, table=raw["table"], rows=_pairs(raw["rows"], "rows", line), by=raw["by"],
        estimator=raw["estimator"], column=raw["column"], method=raw["method"], reference=raw["reference"],
        scale=scale, unit=raw["unit"], estimate=raw["estimate"], window=raw["window"],
        direction=raw["direction"], threshold=raw["threshold"].strip(), min_seeds=min_seeds, ceiling=ceiling,
        requires=_pairs(raw["requires"], "requires", line), paper_setting=raw["paper_setting"],
        parts=tuple(p for p in raw["parts"].split("&") if p),
    )  # fmt: skip


def read_claims(path: str | Path) -> list[ClaimSpec]:
    """Return every row of the claims specification at ``path``, checked (ids unique per version, parts known)."""
    with open(path, newline="") as handle:
        specs = [_row(raw, line) for line, raw in enumerate(csv.DictReader(handle), start=2)]
    keys = [s.key for s in specs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(f"claims.csv holds {repeated} more than once")
    current = {s.id: s for s in specs if s.current}
    for spec in specs:
        if spec.id not in current:
            raise ValueError(f"claims.csv: claim {spec.id!r} has no current version")
        unknown = [p for p in spec.parts if p not in current]
        if unknown:
            raise ValueError(f"claims.csv: joint claim {spec.id!r} joins unknown claim(s) {unknown}")
    return specs


@cache
def _committed() -> tuple[ClaimSpec, ...]:
    return tuple(read_claims(data_dir() / "claims.csv"))


def claim_specs(current_only: bool = False) -> list[ClaimSpec]:
    """Return the committed specification (``data/claims.csv``); ``current_only`` leaves superseded metrics out."""
    return [s for s in _committed() if s.current or not current_only]


def spec_by_id(claim_id: str) -> ClaimSpec:
    """Return the current version of the claim ``claim_id``."""
    for spec in claim_specs(current_only=True):
        if spec.id == claim_id:
            return spec
    raise KeyError(f"no claim {claim_id!r} in data/claims.csv")
