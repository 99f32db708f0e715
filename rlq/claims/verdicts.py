"""The rule that judges each claim of the specification on each preset, and the rule across presets.

The claims, their metrics and thresholds are data (``data/claims.csv``, :mod:`rlq.claims.spec`);
our number comes from the run's own table (:mod:`rlq.claims.measure`). On one preset a claim

- is **by design** when every seed gave the same value: a quantity a fixed schedule sets (a pruning schedule's
  compression) is reported with whether it reaches the threshold, not judged over seeds;
- is **uninformative (ceiling)** when the method and its reference score the task's maximum on every seed;
- has **too few seeds** when fewer than the claim's ``min_seeds`` seeds (or seed pairs) stand behind it: the
  point value is shown, and no verdict;
- otherwise **holds** when the whole 95% interval lies on the claim's side of the threshold, **does not hold**
  when it lies wholly on the other side, and is **inconclusive** when it straddles it. A claim whose
  ``requires`` names a setting the run does not have (CIFAR-10, measured on digits) is inconclusive, with
  what the rule says of that run as the reason.

A **joint** claim (compression gain *and* no reward drop) is judged from its parts on the same preset: it
holds when every part holds (or reaches the threshold by design), does not hold when a part does not (or
falls short by design), and otherwise takes the first of too few seeds, uninformative, inconclusive.

**Across presets** (:func:`overall`): the longest preset (the last in the spec's ``presets``) whose verdict
does not rest on too few seeds decides; a shorter preset whose verdict is the opposite (holds against does
not hold) is named as contradicting it. With no preset at its minimum seeds the claim has too few seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rlq.claims.measure import Measurement
from rlq.claims.spec import FAMILIES, ClaimSpec, claim_specs

VERDICTS = ("holds", "does not hold", "inconclusive")
"""The verdicts an interval can give."""

BY_DESIGN, CEILING, TOO_FEW = "by design", "uninformative (ceiling)", "too few seeds"
OUTCOMES = (*VERDICTS, TOO_FEW, BY_DESIGN, CEILING)
"""Every outcome a claim can have on a preset that measured it."""

__all__ = ["FAMILIES", "OUTCOMES", "VERDICTS", "Verdict", "judge", "judge_joint", "overall", "claim_specs"]


@dataclass(frozen=True)
class Verdict:
    """Our estimate of a claim on one preset, its interval and seeds, and the outcome of the rule."""

    value: float
    lower: float
    upper: float
    n: int | None
    verdict: str
    reason: str
    threshold: float
    reaches: bool | None = None
    """Whether the point value lies on the claim's side of the threshold (for by-design quantities)."""


def _fmt(x: float) -> str:
    return f"{x + 0.0:.3g}"  # + 0.0: a drop of -0.0 reads 0


def _unmet(spec: ClaimSpec, results: dict[str, Any]) -> str | None:
    """Return what of the setting ``spec.requires`` the run lacks (e.g. ``dataset is digits, not cifar10``)."""
    for key, wanted in spec.requires:
        got = results.get(key)
        if str(got) != wanted:
            return f"{key} is {got or 'not recorded'}, not {wanted}"
    return None


def judge(spec: ClaimSpec, found: Measurement, paper_value: float, results: dict[str, Any]) -> Verdict:
    """Return the outcome of the module's rule on ``spec`` for one run's measurement."""
    est, limit = found.estimate, spec.limit(paper_value)
    on_side = est.value >= limit if spec.direction == ">=" else est.value <= limit

    def verdict(outcome: str, reason: str) -> Verdict:
        return Verdict(est.value, est.lower, est.upper, est.n, outcome, reason, limit, on_side)

    if found.at_ceiling:
        return verdict(CEILING, f"both score the task's maximum, {_fmt(spec.ceiling or 0.0)}, on every seed")
    if found.by_design:
        side = "reaches" if on_side else "falls short of"
        return verdict(BY_DESIGN, f"{_fmt(est.value)} on every seed {side} {_fmt(limit)}")
    if est.n < spec.min_seeds:
        return verdict(TOO_FEW, f"{est.n} of the {spec.min_seeds} seeds the claim needs")
    span = f"{_fmt(est.lower)} to {_fmt(est.upper)}"
    inside = est.lower >= limit if spec.direction == ">=" else est.upper <= limit
    outside = est.upper < limit if spec.direction == ">=" else est.lower > limit
    if inside:
        outcome, reason = "holds", f"interval {span} {spec.direction} {_fmt(limit)}"
    elif outside:
        outcome, reason = "does not hold", f"interval {span} on the wrong side of {_fmt(limit)}"
    else:
        outcome, reason = "inconclusive", f"interval {span} straddles {_fmt(limit)}"
    unmet = _unmet(spec, results)
    if unmet and outcome != "inconclusive":
        outcome, reason = (
            "inconclusive",
            f"not the paper's setting ({unmet}); on this run the rule says {outcome}",
        )
    return verdict(outcome, reason)


def judge_joint(spec: ClaimSpec, parts: dict[str, Verdict | None]) -> Verdict | None:
    """Return the joint claim's outcome from its parts' verdicts on one preset, or None if a part is unmeasured."""
    if any(v is None for v in parts.values()) or not parts:
        return None
    verdicts = {name: v for name, v in parts.items() if v is not None}
    passes = [v.verdict == "holds" or (v.verdict == BY_DESIGN and v.reaches) for v in verdicts.values()]
    fails = [
        v.verdict == "does not hold" or (v.verdict == BY_DESIGN and not v.reaches) for v in verdicts.values()
    ]
    if any(fails):
        outcome = "does not hold"
    elif all(passes):
        outcome = "holds"
    else:
        rest = [v.verdict for v in verdicts.values()]
        outcome = next((o for o in (TOO_FEW, CEILING) if o in rest), "inconclusive")
    reason = ", ".join(f"{name.split(': ', 1)[-1]} {v.verdict}" for name, v in verdicts.items())
    n = min((v.n for v in verdicts.values() if v.n is not None), default=None)
    return Verdict(math.nan, math.nan, math.nan, n, outcome, reason, math.nan)


def overall(spec: ClaimSpec, by_preset: dict[str, Verdict | None]) -> tuple[str, str, str | None]:
    """Return the claim's verdict across its presets, the reason, and the preset that decided it (None: none).

    ``by_preset`` maps each of ``spec.presets`` to its verdict there (None: not measured).
    """
    measured = [(p, by_preset[p]) for p in spec.presets if by_preset.get(p) is not None]
    if not measured:
        return "not measured", "no finished run of " + " or ".join(spec.presets), None
    enough = [(p, v) for p, v in measured if v is not None and v.verdict != TOO_FEW]
    if not enough:
        return TOO_FEW, "no preset has the claim's minimum seeds", None
    decider, decided = enough[-1]
    assert decided is not None
    opposite = {"holds": "does not hold", "does not hold": "holds"}.get(decided.verdict)
    against = [p for p, v in enough[:-1] if v is not None and v.verdict == opposite]
    later = spec.presets[spec.presets.index(decider) + 1 :]
    pending = [p for p, v in measured if p in later and v is not None and v.verdict == TOO_FEW]
    reason = f"decided on {decider}"
    if against:
        reason += f"; contradicted by {', '.join(against)} ({opposite})"
    if pending:
        reason += f"; {', '.join(pending)} has too few seeds yet"
    return decided.verdict, reason, decider
