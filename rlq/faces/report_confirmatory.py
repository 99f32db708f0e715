"""The README's table of confirmatory verdicts: every registered claim, its seeds done and its outcome.

Only runs of the registered design (:mod:`rlq.claims.design`), published by ``rlq campaign``,
decide a verdict here; exploratory results are reported apart (:mod:`rlq.faces.report_claims`).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlq.claims import confirmatory_statistics as cs
from rlq.claims.campaign import (
    ANY_CPU,
    CampaignState,
    campaign_state,
    claim_commits,
    claim_outcomes,
    expected_minutes,
    jobs_left,
    results_root,
    spec_history,
)
from rlq.claims.design import Outcome, RegisteredClaim
from rlq.experiments.paths import repo_root

HEADER = "| Claim | Paper | Registered test | Seeds done | Ours [one-sided 95% bounds] | Verdict |"


def _test(claim: RegisteredClaim) -> str:
    if claim.statistic == "joint":
        return "every part holds"
    if not claim.runs:
        return "-"
    what = {
        "t_mean": "mean",
        "t_paired_difference": "paired difference",
        "t_paired_change_pct": "paired change",
    }
    return f"{what[claim.statistic]} {claim.direction} {claim.threshold:g} {claim.unit} (`{claim.preset}`)"


def _verdict(claim: RegisteredClaim, outcome: str, reason: str) -> str:
    decided = outcome in ("holds", "does not hold", "inconclusive")
    cell = f"**{outcome}**" if decided else outcome
    if claim.statistic == "joint" and outcome not in ("holds", "runs remaining"):
        return f"{cell} (its parts: {reason})"  # its outcome is one of its parts': all are named
    if outcome == "inconclusive":
        return f"{cell} (registered power {claim.power():.2f})"
    if outcome == "underpowered at our budget" and claim.design_sd is not None:
        return f"{outcome} (power {cs.power(20, claim.design_sd, claim.design_distance):.2f} at 20 seeds)"
    if outcome == "not testable here":
        return f"{outcome} ({reason.split(':')[0]})"
    return cell


def registration(root: Path, state: CampaignState | None = None) -> str:
    """Return ``<short commit> on <date>`` of the design's first registration, then, for each later
    registration of some of its claims, the folder their jobs publish into with its commit and date."""
    commits = claim_commits(root)
    claims = {c.id: c for c in (state or campaign_state(root)).claims}

    def show(commit: str, fmt: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), "show", "-s", f"--format={fmt}", commit],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    history = spec_history(root)  # newest first
    first, *later = sorted(set(commits.values()), key=history.index, reverse=True)
    parts = []
    for commit in later:
        where = sorted(
            {f"{claims[i].experiment}/{claims[i].published_as}" for i, c in commits.items() if c == commit}
        )
        parts.append(f"{', '.join(where)}: `{commit[:7]}` on {show(commit, '%cs')}")
    registered = f"`{first[:7]}` on {show(first, '%cs')}"
    return registered + (f" (registered again: {'; '.join(parts)})" if parts else "")


def confirmatory_markdown(root: Path | None = None) -> str:
    """Return the Markdown block of confirmatory verdicts for the checkout ``root`` (default this one)."""
    root = root or repo_root()
    state = campaign_state(root)
    outcomes = claim_outcomes(state, results_root(root))
    remaining, stopped = jobs_left(state, results_root(root))
    # on any CPU: the README's block reads the same whichever machine regenerates it
    hours = sum(expected_minutes(job, results_root(root), cpu=ANY_CPU) for job in remaining) / 60.0
    published = len(state.jobs) - len(remaining) - len(stopped)
    halted = f", {len(stopped)} stopped by their claims' floor rule" if stopped else ""
    lines = [
        f"**Registered {registration(root, state)}: {published} of {len(state.jobs)} jobs published{halted}, "
        f"{hours:.1f} core-hours left**",
        "",
        HEADER,
        "|---|---|---|---|---|---|",
    ]
    for claim in state.claims:
        got = outcomes[claim.id]
        done = f"{got.n} of {claim.seeds}" if claim.runs and claim.statistic != "joint" else "-"
        ours = "-"
        if got.bounds is not None:
            b = got.bounds
            ours = f"{b.mean:.3g} [{b.lower:.3g}, {b.upper:.3g}] {claim.unit}"
        verdict = _verdict(claim, got.outcome, got.reason)
        lines.append(
            f"| {claim.label} | {claim.paper_claim} | {_test(claim)} | {done} | {ours} | {verdict} |"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class DecidedClaim:
    """A registered claim its t bounds decided, with its outcome."""

    claim: RegisteredClaim
    outcome: Outcome

    @property
    def values(self) -> np.ndarray:
        """The per-seed (or per-pair) values behind the bounds."""
        return np.asarray(self.outcome.values, dtype=float)


def decided_claims(root: Path | None = None) -> list[DecidedClaim]:
    """Return, in the design's order, every claim of the checkout ``root`` that its published confirmatory runs
    decided by the one-sided t bounds (holds, does not hold, inconclusive), with its per-seed values."""
    root = root or repo_root()
    state = campaign_state(root)
    outcomes = claim_outcomes(state, results_root(root))
    # a claim not decided by its bounds has none (a joint claim has none of its own)
    return [DecidedClaim(c, outcomes[c.id]) for c in state.claims if outcomes[c.id].bounds is not None]
