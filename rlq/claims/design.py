"""The confirmatory design: each claim's registered test, seed count and jobs (``data/claims_confirmatory.csv``).

This is the claims specification's confirmatory version, registered before any of its runs. Each row fixes
the experiment and preset that measure a claim, the table and column, the per-seed statistic (one arm's
value, a paired difference or a paired percent change), the threshold, the number of seeds, the arms whose
training jobs supply them and the jobs' priority and expected minutes, the spread and distance the seed
count was powered for, and, where no runs can decide the claim here, the outcome registered instead
(``underpowered at our budget`` or ``not testable here``) with the computation behind it.

Confirmatory seeds start at :data:`SEED_START`; nothing run before the registration used them. A one-seed
pilot (``pilot``, e.g. ``dense:900``) runs first where the setting must be checked, and is exploratory: its
value gates the claim (``floor``) and is never pooled into the verdict. The verdict rule is
:func:`judge`; the statistics are :mod:`rlq.claims.confirmatory_statistics`.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd

from rlq.claims import confirmatory_statistics as cs
from rlq.claims.spec import key_value_pairs
from rlq.experiments.paths import data_dir

SPEC_FILE = "claims_confirmatory.csv"
SEED_START = 1000
"""The first confirmatory seed: every registered job trains seed ``SEED_START + i``."""
STATISTICS = ("t_mean", "t_paired_difference", "t_paired_change_pct", "joint", "none")
"""How a claim's per-seed values are formed; ``none`` registers an outcome instead of runs."""
REGISTERED_OUTCOMES = ("underpowered at our budget", "not testable here")
RUNS_REMAINING, TOO_FEW = "runs remaining", "too few seeds"
FLOOR, CEILING, BY_DESIGN = "uninformative (floor)", "uninformative (ceiling)", "by design"


@dataclass(frozen=True)
class RegisteredClaim:
    """One row of the confirmatory design."""

    id: str
    label: str
    family: str
    paper_claim: str
    experiment: str
    preset: str
    published_as: str
    """The folder under ``data/results/<experiment>/`` its jobs are published into, merged by seed."""
    table: str
    rows: tuple[tuple[str, tuple[str, ...]], ...]
    """Rows kept: column -> accepted values (``bits=3|32``)."""
    pair: tuple[str, ...]
    """The columns that pair arms (``seed``, or ``task;seed``)."""
    by: str
    column: str
    """The metric's column, or ``a/b`` for a ratio of two columns."""
    method: str
    reference: str
    statistic: str
    scale: float
    unit: str
    direction: str
    threshold: float
    seeds: int
    """Per-seed values (or pairs) the verdict needs."""
    arms: tuple[tuple[str, int], ...]
    """The training jobs: arm -> number of seeds, from :data:`SEED_START` on."""
    ceiling: float | None
    floor: float | None
    pilot: tuple[str, int] | None
    priority: int
    job_minutes: float
    design_sd: float | None
    design_distance: float | None
    parts: tuple[str, ...]
    registered_outcome: str
    design: str

    @property
    def runs(self) -> bool:
        """Return True when training jobs decide the claim (not a joint claim or a registered outcome)."""
        return self.statistic not in ("joint", "none")

    def power(self) -> float | None:
        """Return the power the registered seed count has at the design's spread and distance."""
        if self.design_sd is None or self.design_distance is None or self.seeds < 2:
            return None
        return cs.power(self.seeds, self.design_sd, self.design_distance)


def _number(raw: dict[str, str], name: str, line: int, kind: type = float) -> float | None:
    text = raw[name].strip()
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        raise ValueError(
            f"{SPEC_FILE} line {line} ({raw['id']!r}): {name} {text!r} is not a number"
        ) from None


def _rows(text: str, line: int) -> tuple[tuple[str, tuple[str, ...]], ...]:
    pairs = key_value_pairs(text, "rows", f"{SPEC_FILE} line {line}")
    return tuple((key, tuple(v.strip() for v in values.split("|"))) for key, values in pairs)


def _arms(text: str, line: int) -> tuple[tuple[str, int], ...]:
    out = []
    for item in filter(None, (t.strip() for t in text.split(";"))):
        arm, sep, count = item.partition(":")
        if not sep or not count.strip().isdigit() or int(count) < 1:
            raise ValueError(f"{SPEC_FILE} line {line}: arms {item!r} is not arm:seeds")
        out.append((arm.strip(), int(count)))
    return tuple(out)


def _check(claim: RegisteredClaim, line: int) -> None:
    def bad(field: str, why: str) -> ValueError:
        return ValueError(f"{SPEC_FILE} line {line} ({claim.id!r}): {field} {getattr(claim, field)!r} {why}")

    if claim.statistic not in STATISTICS:
        raise bad("statistic", f"is not one of {', '.join(STATISTICS)}")
    if (claim.statistic == "none") != bool(claim.registered_outcome):
        raise bad("registered_outcome", "must be given exactly when the statistic is none")
    if claim.registered_outcome and claim.registered_outcome not in REGISTERED_OUTCOMES:
        raise bad("registered_outcome", f"is not one of {', '.join(REGISTERED_OUTCOMES)}")
    if (claim.statistic == "joint") != bool(claim.parts):
        raise bad("parts", "must name the claims a joint claim joins, and only a joint claim has parts")
    if claim.runs and not (claim.table and claim.column and claim.method and claim.arms and claim.pair):
        raise bad("table", "and column, method, arms and pair are needed for a claim decided by runs")
    if claim.runs and claim.seeds < 5:
        raise bad("seeds", "is below 5, the least any claim is judged on")
    if claim.statistic.startswith("t_paired") and not claim.reference:
        raise bad("reference", "is needed by a paired statistic")
    if claim.statistic != "joint" and claim.direction not in (">=", "<="):
        raise bad("direction", "is not >= or <=")


def _claim(raw: dict[str, str], line: int) -> RegisteredClaim:
    missing = [f.name for f in fields(RegisteredClaim) if f.name not in raw]
    if missing:
        raise ValueError(f"{SPEC_FILE} lacks the column(s) {missing}")
    pilot = None
    if raw["pilot"].strip():
        arm, _, seed = raw["pilot"].partition(":")
        if not seed.strip().isdigit() or int(seed) >= SEED_START:
            raise ValueError(
                f"{SPEC_FILE} line {line}: pilot {raw['pilot']!r} is not arm:seed below {SEED_START}"
            )
        pilot = (arm.strip(), int(seed))
    claim = RegisteredClaim(
        id=raw["id"], label=raw["label"], family=raw["family"], paper_claim=raw["paper_claim"],
        experiment=raw["experiment"], preset=raw["preset"], published_as=raw["published_as"], table=raw["table"],
        rows=_rows(raw["rows"], line), pair=tuple(p for p in raw["pair"].split(";") if p), by=raw["by"],
        column=raw["column"], method=raw["method"], reference=raw["reference"], statistic=raw["statistic"],
        scale=_number(raw, "scale", line) or 1.0, unit=raw["unit"], direction=raw["direction"],
        threshold=_number(raw, "threshold", line) or 0.0, seeds=int(_number(raw, "seeds", line, int) or 0),
        arms=_arms(raw["arms"], line), ceiling=_number(raw, "ceiling", line), floor=_number(raw, "floor", line),
        pilot=pilot, priority=int(_number(raw, "priority", line, int) or 0),
        job_minutes=_number(raw, "job_minutes", line) or 0.0, design_sd=_number(raw, "design_sd", line),
        design_distance=_number(raw, "design_distance", line), parts=tuple(p for p in raw["parts"].split("&") if p),
        registered_outcome=raw["registered_outcome"].strip(), design=raw["design"],
    )  # fmt: skip
    _check(claim, line)
    return claim


def read_design(path: str | Path | None = None) -> list[RegisteredClaim]:
    """Return every claim of the confirmatory design at ``path`` (default ``data/claims_confirmatory.csv``),
    checked: ids unique, joint claims joining known claims on their own experiment and preset."""
    path = Path(path) if path is not None else data_dir() / SPEC_FILE
    with open(path, newline="") as handle:
        claims = [_claim(raw, line) for line, raw in enumerate(csv.DictReader(handle), start=2)]
    ids = [c.id for c in claims]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"{SPEC_FILE} holds {repeated} more than once")
    by_id = {c.id: c for c in claims}
    for claim in claims:
        unknown = [p for p in claim.parts if p not in by_id]
        if unknown:
            raise ValueError(f"{SPEC_FILE}: joint claim {claim.id!r} joins unknown claim(s) {unknown}")
        if claim.pilot is not None:
            pilot_gate(claim, claims)
    return claims


def pilot_gate(claim: RegisteredClaim, claims: list[RegisteredClaim]) -> RegisteredClaim:
    """Return the claim whose table and column give the score of ``claim``'s pilot, checked against the floor.

    A pilot is a run of one arm (``dense:900``), so its score is that arm's value: of the claim's own column
    where the arm is the claim's method or reference (football's score against dense), else of the column of
    the claim beside it, on the same experiment, folder and pilot, that measures the arm (football's
    compression claim, whose column is GST's compression and holds 0 for dense, is gated by the score claim).
    Raises ValueError when no claim measures the pilot's arm.
    """
    arm = claim.pilot[0] if claim.pilot else ""
    beside = [
        c for c in claims
        if (c.experiment, c.published_as, c.pilot) == (claim.experiment, claim.published_as, claim.pilot)
    ]  # fmt: skip
    for candidate in [claim, *beside]:
        if arm and arm in (candidate.method, candidate.reference):
            return candidate
    raise ValueError(
        f"{SPEC_FILE} ({claim.id!r}): no claim on {claim.experiment}/{claim.published_as} measures the "
        f"pilot's arm {arm!r}, so nothing gives the pilot's score"
    )


def _matches(series: pd.Series, accepted: tuple[str, ...]) -> pd.Series:
    def one(value: object) -> bool:
        for text in accepted:
            try:
                if float(value) == float(text):  # type: ignore[arg-type]
                    return True
            except (TypeError, ValueError):
                if str(value) == text:
                    return True
        return False

    return series.map(one)


def _column(table: pd.DataFrame, column: str) -> pd.Series:
    numerator, _, denominator = column.partition("/")
    values = table[numerator.strip()].astype(float)
    return values / table[denominator.strip()].astype(float) if denominator else values


def arm_values(claim: RegisteredClaim, table: pd.DataFrame, arm: str) -> pd.Series:
    """Return ``arm``'s confirmatory values of the claim's column (scaled), indexed by the claim's pair keys."""
    kept = table[table["seed"].astype(int) >= SEED_START] if "seed" in table else table
    for column, accepted in claim.rows:
        kept = kept[_matches(kept[column], accepted)]
    kept = kept[kept[claim.by].astype(str) == arm]
    values = _column(kept, claim.column)
    values.index = pd.MultiIndex.from_frame(kept[list(claim.pair)].astype(str))
    return values.groupby(level=list(range(len(claim.pair)))).mean()


def per_seed_values(claim: RegisteredClaim, table: pd.DataFrame) -> np.ndarray:
    """Return the claim's statistic per seed (or seed pair) from a published confirmatory table.

    A reference with one value on every seed it ran (a fixed pruning schedule's compression) pairs with every
    seed of the method; otherwise only the pairs both arms ran count.
    """
    method = arm_values(claim, table, claim.method)
    if claim.statistic == "t_mean":
        return (method * claim.scale).to_numpy()
    reference = arm_values(claim, table, claim.reference)
    if len(reference) and np.allclose(reference.to_numpy(), reference.iloc[0], rtol=1e-9, atol=0.0):
        reference = pd.Series(reference.iloc[0], index=method.index)
    method, reference = method.align(reference, join="inner")
    if claim.statistic == "t_paired_difference":
        return ((method - reference) * claim.scale).to_numpy()
    return (100.0 * (method - reference) / reference.abs()).to_numpy()


@dataclass(frozen=True)
class Outcome:
    """A registered claim's outcome on its confirmatory runs."""

    outcome: str
    reason: str
    n: int
    """Per-seed values (or pairs) behind it."""
    bounds: cs.OneSidedBounds | None = None
    values: tuple[float, ...] = ()
    """The per-seed values (or pairs) its bounds were computed from, where the bounds decided it."""


def _at(values: pd.Series, level: float | None) -> bool:
    return level is not None and len(values) > 0 and bool(np.allclose(values.to_numpy(), level))


def _not_judged(
    claim: RegisteredClaim, table: pd.DataFrame | None, values: np.ndarray, complete: bool
) -> Outcome | None:
    """Return the outcome of a claim whose values cannot be judged yet or at all, else None."""
    if not complete:
        return Outcome(RUNS_REMAINING, f"{len(values)} of {claim.seeds} registered values", len(values))
    if len(values) < claim.seeds:  # every job ran, yet fewer pairs: the arms' seeds do not pair
        return Outcome(TOO_FEW, f"{len(values)} of {claim.seeds} registered values pair up", len(values))
    if claim.ceiling is not None and _at(arm_values(claim, table, claim.method), claim.ceiling):
        if not claim.reference or _at(arm_values(claim, table, claim.reference), claim.ceiling):
            return Outcome(CEILING, f"every seed scored the maximum {claim.ceiling:g}", len(values))
    if np.allclose(values, values[0], rtol=1e-9, atol=0.0):
        reaches = values[0] >= claim.threshold if claim.direction == ">=" else values[0] <= claim.threshold
        word = "reaches" if reaches else "misses"
        return Outcome(
            BY_DESIGN, f"every seed gave {values[0]:.4g}, which {word} {claim.threshold:g}", len(values)
        )
    return None


def judge(
    claim: RegisteredClaim, table: pd.DataFrame | None, complete: bool, pilot: float | None = None
) -> Outcome:
    """Return the outcome of the registered rule on the claim's published confirmatory table.

    In order: a registered outcome; a pilot below the floor (uninformative); runs remaining while not every
    registered job is published (``complete``); too few seeds when every job ran but fewer values pair up;
    method and reference at the task's maximum on every seed (uninformative); every seed the same value (by
    design, with whether it reaches the threshold); else the one-sided t bounds: holds, does not hold or
    inconclusive (with the registered power).
    """
    if claim.registered_outcome:
        return Outcome(claim.registered_outcome, claim.design, 0)
    if claim.floor is not None and pilot is not None and pilot < claim.floor:
        why = f"the {claim.pilot[0]} pilot (seed {claim.pilot[1]}) scored {pilot:.3g} < {claim.floor:g}"
        return Outcome(FLOOR, why, 0)
    values = per_seed_values(claim, table) if table is not None and len(table) else np.array([])
    early = _not_judged(claim, table, values, complete)
    if early is not None:
        return early
    bounds = cs.t_bounds(values)
    verdict = cs.outcome(bounds, claim.direction, claim.threshold)
    reason = f"{bounds.mean:.3g} [{bounds.lower:.3g}, {bounds.upper:.3g}] against {claim.threshold:g}"
    if verdict == "inconclusive" and claim.power() is not None:
        reason += f"; registered power {claim.power():.2f}"
    return Outcome(verdict, reason, len(values), bounds, tuple(float(v) for v in values))


def judge_joint(claim: RegisteredClaim, parts: list[Outcome]) -> Outcome:
    """Return a joint claim's outcome from its parts': holds only when every part holds on its data."""
    outcomes = [p.outcome for p in parts]
    reason = "; ".join(outcomes)
    misses = [p for p in parts if p.outcome == BY_DESIGN and "misses" in p.reason]
    if "does not hold" in outcomes or misses:
        return Outcome("does not hold", reason, 0)
    for first in (RUNS_REMAINING, TOO_FEW, *REGISTERED_OUTCOMES, FLOOR, CEILING, BY_DESIGN, "inconclusive"):
        if first in outcomes:
            return Outcome(first, reason, 0)
    return Outcome("holds", reason, min(p.n for p in parts))


def simulated_values(claim: RegisteredClaim, shift: float) -> np.ndarray:
    """Return ``claim.seeds`` values with the design's spread whose mean lies ``shift`` design distances from
    the threshold on the claim's side (negative: the other side); the spread pattern is fixed, so the
    sample's mean and sd are exactly those asked for."""
    if claim.design_sd is None or claim.design_distance is None:
        raise ValueError(f"claim {claim.id!r} has no design spread and distance to simulate from")
    pattern = np.linspace(-1.0, 1.0, claim.seeds)
    pattern = pattern / pattern.std(ddof=1)
    side = 1.0 if claim.direction == ">=" else -1.0
    return claim.threshold + side * shift * claim.design_distance + claim.design_sd * pattern


def core_hours(claims: list[RegisteredClaim]) -> float:
    """Return the registered jobs' expected core-hours (each job one core for its ``job_minutes``)."""
    from rlq.claims.campaign_jobs import registered_jobs

    return math.fsum(job.minutes for job in registered_jobs(claims)) / 60.0
