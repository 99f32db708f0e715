"""The papers' claims, as specified in ``data/claims.csv``, and the rule that judges them (``rlq.claims``).

The implementation is :mod:`rlq.experiments.claim_verdicts` (the rule), :mod:`rlq.experiments.claim_spec` (the
specification) and :mod:`rlq.experiments.claim_measure` (our number, from a run's own table); this module is
their public name. On a preset a claim **holds** when its whole 95% interval lies on the claim's side of the
threshold, **does not hold** when it lies wholly on the other side, and is **inconclusive** when it straddles
it; below the claim's minimum seeds it has **too few seeds**, a quantity the same on every seed is **by
design**, and a reward at the task's maximum for both arms on every seed is **uninformative (ceiling)**.
"""

from rlq.experiments.claim_measure import Measurement, measure, measure_table, spec_estimates
from rlq.experiments.claim_spec import FAMILIES, ClaimSpec, claim_specs, read_claims, spec_by_id
from rlq.experiments.claim_verdicts import OUTCOMES, VERDICTS, Verdict, judge, judge_joint, overall

__all__ = [
    "FAMILIES",
    "OUTCOMES",
    "VERDICTS",
    "ClaimSpec",
    "Measurement",
    "Verdict",
    "claim_specs",
    "judge",
    "judge_joint",
    "measure",
    "measure_table",
    "overall",
    "read_claims",
    "spec_by_id",
    "spec_estimates",
]
