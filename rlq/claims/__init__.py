"""The papers' claims, as specified in ``data/claims.csv``, and the rule that judges them (``rlq.claims``).

- :mod:`rlq.claims.spec`: the specification; :mod:`rlq.claims.measure`: our number, from a run's own table;
  :mod:`rlq.claims.verdicts`: the rule. Their public names are re-exported here.
- :mod:`rlq.claims.design`: the confirmatory design (``data/claims_confirmatory.csv``), registered before
  its runs, with :mod:`rlq.claims.confirmatory_statistics` (its estimators and power simulation);
  :mod:`rlq.claims.campaign_jobs` and :mod:`rlq.claims.campaign`: the jobs it registers and ``rlq campaign``,
  which runs them a few hours at a time from the registering commit and publishes each.

On a preset a claim **holds** when its whole 95% interval lies on the claim's side of the
threshold, **does not hold** when it lies wholly on the other side, and is **inconclusive** when it straddles
it; below the claim's minimum seeds it has **too few seeds**, a quantity the same on every seed is **by
design**, and a reward at the task's maximum for both arms on every seed is **uninformative (ceiling)**.
"""

from rlq.claims.measure import Measurement, measure, measure_table, spec_estimates
from rlq.claims.spec import FAMILIES, ClaimSpec, claim_specs, read_claims, spec_by_id
from rlq.claims.verdicts import OUTCOMES, VERDICTS, Verdict, judge, judge_joint, overall

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
