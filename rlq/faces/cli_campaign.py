"""``rlq campaign status`` and ``rlq campaign run``: the registered confirmatory design, job by job."""

from __future__ import annotations

import argparse
from typing import Any


def _cmd_status(args: argparse.Namespace) -> int:
    from rlq.claims.campaign import (
        campaign_state,
        claim_outcomes,
        expected_minutes,
        job_progress,
        jobs_left,
        running_elsewhere,
    )
    from rlq.experiments.paths import repo_root

    state = campaign_state()
    root = repo_root()
    outcomes = claim_outcomes(state)
    for claim in state.claims:
        outcome = outcomes[claim.id]
        done = f"{outcome.n} of {claim.seeds}" if claim.runs else "-"
        print(f"{claim.id:32s} {done:>9s}  {outcome.outcome}: {outcome.reason}")
    remaining, stopped = jobs_left(state)
    hours = sum(expected_minutes(job) for job in remaining) / 60.0
    published = len(state.jobs) - len(remaining) - len(stopped)
    halted = f", {len(stopped)} stopped by their claims' floor rule" if stopped else ""
    print(f"{published} of {len(state.jobs)} jobs published{halted}; {hours:.1f} core-hours left")
    running = [job for job in remaining if running_elsewhere(root, job)]
    for job in running:
        print(
            f"running: {job.experiment}/{job.published_as} {job.name} ({job_progress(root, job) or 'starting'})"
        )
    for job in [job for job in remaining if job not in running][: args.next]:
        print(f"next: {job.experiment}/{job.published_as} {job.name} (about {expected_minutes(job):.0f} min)")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from rlq.claims.campaign import run_campaign

    if args.hours <= 0 or args.workers < 1:
        raise ValueError(
            f"--hours must be positive and --workers at least 1 (got {args.hours}, {args.workers})"
        )
    published = run_campaign(args.hours, args.workers, address=args.address, poll=5.0)
    print(f"rlq campaign: {published} job(s) published")
    return 0


def add_campaign_parser(sub: Any) -> None:
    """Add ``rlq campaign`` (status, run) to the ``rlq`` command's subparsers."""
    campaign = sub.add_parser(
        "campaign", help="the registered confirmatory design: its jobs, runs and verdicts"
    )
    commands = campaign.add_subparsers(dest="campaign_command", required=True)
    p = commands.add_parser(
        "status", help="each claim's seeds done against registered, core-hours left, next jobs"
    )
    p.add_argument("--next", type=int, default=5, help="how many of the next jobs to list")
    p.set_defaults(func=_cmd_status)
    p = commands.add_parser(
        "run", help="run the remaining jobs that end before a deadline; publish each at once"
    )
    p.add_argument("--hours", type=float, required=True, help="the deadline: hours from now")
    p.add_argument("--workers", type=int, default=2, help="jobs side by side, one core each (default 2)")
    p.add_argument(
        "--address",
        default="",
        help="a Ray cluster's address: every remaining job starts at once, as a Ray task",
    )
    p.set_defaults(func=_cmd_run)
