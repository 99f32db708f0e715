"""The papers' claims and the one rule that judges each from its interval over seeds (``rlq.claims``).

The implementation is :mod:`rlq.experiments.claims`; this module is its public name. A claim **holds** when
its whole 95% interval lies on the claim's side of the paper's threshold, **does not hold** when it lies
wholly on the other side, and is **inconclusive** when it straddles it or fewer than 3 seeds stand behind it.
"""

from rlq.experiments.claims import (
    CLAIMS,
    COMPRESSION_TOLERANCE_PP,
    FAMILIES,
    REWARD_TOLERANCE_PCT,
    VERDICTS,
    Claim,
    Verdict,
    judge,
    our_estimate,
)

__all__ = [
    "CLAIMS",
    "COMPRESSION_TOLERANCE_PP",
    "FAMILIES",
    "REWARD_TOLERANCE_PCT",
    "VERDICTS",
    "Claim",
    "Verdict",
    "judge",
    "our_estimate",
]
