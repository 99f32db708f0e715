"""The report's claims table: every claim of the specification on every preset that measured it.

One row per claim, metric version, preset and run (:func:`claims_table`). On each preset the published
result answers (else the newest finished run folder); every other finished run of the same preset is a
``replication`` row shown beside it, never dropped. Each current claim's verdict across its presets is the
rule of :func:`rlq.claims.verdicts.overall`, repeated on each of its rows (``overall``, ``overall_reason``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from rlq.claims.measure import measure
from rlq.claims.spec import FAMILIES, ClaimSpec, claim_specs
from rlq.claims.verdicts import Verdict, judge, judge_joint, overall
from rlq.experiments.paper import paper_numbers

if TYPE_CHECKING:
    from rlq.faces.report import RunRecord

NOT_MEASURED = "not measured"
SUPERSEDED = "superseded"


def partner_metric(metric: str) -> str | None:
    """Return the other end of a paper range's metric (``x_min`` <-> ``x_max``), or None."""
    for end, other in (("_min", "_max"), ("_max", "_min")):
        if metric.endswith(end):
            return metric[: -len(end)] + other
    return None


def paper_row(paper: pd.DataFrame, spec: ClaimSpec) -> tuple[pd.Series, float | None, float | None, set[int]]:
    """Return the claim's paper row, the paper's range (low, high) if it reports one, and the rows used."""
    same = paper[(paper["paper"] == spec.paper) & (paper["experiment"] == spec.paper_experiment)]
    rows = same[same["metric"] == spec.paper_metric]
    if rows.empty:
        raise LookupError(
            f"claim {spec.key}: {spec.paper}/{spec.paper_experiment}/{spec.paper_metric} has no row in data/paper"
        )
    row, used = rows.iloc[0], {int(rows.index[0])}
    partner = partner_metric(spec.paper_metric)
    other = same[same["metric"] == partner] if partner else same.iloc[0:0]
    if other.empty:
        return row, None, None, used
    used.add(int(other.index[0]))
    pair = sorted([float(row["value"]), float(other["value"].iloc[0])])
    return row, pair[0], pair[1], used


def rule_text(spec: ClaimSpec) -> str:
    """Return the claim's rule in words: its metric, the test against the paper and the seeds it needs."""
    if spec.estimator == "joint":
        return f"{spec.window}; every part must hold on that preset"
    return f"{spec.window}: ours {spec.direction} {spec.threshold}, on at least {spec.min_seeds} seeds"


def run_setting(run: RunRecord) -> str:
    """Return what the run measured on, in a few words (tasks, steps, scenario, data, network)."""
    params, results = run.params, run.results
    parts = []
    tasks = params.get("convergence_tasks") if results.get("convergence_setting") else None
    tasks = list(tasks) if isinstance(tasks, dict) else tasks or params.get("env_ids") or params.get("env_id")
    runs = params.get("runs")  # PTQ and QAT: agents as [algorithm, env_id, hyperparameters]
    if not tasks and isinstance(runs, list):
        tasks = [" ".join(map(str, r[:2])) for r in runs if isinstance(r, list)]
    tasks = [tasks] if isinstance(tasks, str) else tasks
    if isinstance(tasks, list) and tasks:
        parts.append(", ".join(map(str, tasks)))
    for key in ("scenario", "dataset"):
        if results.get(key):
            parts.append(f"{key} {results[key]}")
    steps = params.get("total_timesteps")
    if isinstance(steps, int) and not isinstance(steps, bool):
        parts.append(f"{steps:,} steps")
    if results.get("convergence_setting"):
        parts.append(str(results["convergence_setting"]))
    speedup = (results.get("estimates") or {}).get("speedup_int8_vs_fp32")
    if isinstance(speedup, dict) and speedup.get("regime"):
        parts.append(f"the {speedup['regime']} regime")
    return "; ".join(parts)


def _answering(records: list[RunRecord], spec: ClaimSpec, preset: str) -> list[RunRecord]:
    """Return the finished runs of ``preset``: the one that answers first (published, else newest), then the rest."""
    runs = [
        r
        for r in records
        if r.experiment == spec.experiment
        and r.preset == preset
        and r.status == "ok"
        and (r.published or not r.variant_of_preset)
    ]
    published = [r for r in runs if r.published]
    local = sorted((r for r in runs if not r.published), key=lambda r: str(r.results.get("finished", "")))
    return published + local[::-1]


def _verdict(spec: ClaimSpec, run: RunRecord, paper_value: float) -> Verdict | None:
    found = measure(spec, run.path, run.results)
    return None if found is None else judge(spec, found, paper_value, run.results)


def _base(spec: ClaimSpec, paper: pd.DataFrame) -> dict[str, Any]:
    row, low, high, _ = paper_row(paper, spec)
    return {
        "family": spec.family, "claim": spec.label, "id": spec.id, "version": spec.version,
        "status": spec.status, "paper": spec.paper, "experiment": spec.paper_experiment,
        "metric": spec.paper_metric, "unit": spec.unit, "rule": rule_text(spec),
        "paper_value": float(row["value"]), "paper_low": low, "paper_high": high,
        "ours_experiment": spec.experiment, "min_seeds": spec.min_seeds, "joint": spec.estimator == "joint",
        **dict.fromkeys(["preset", "ours", "lower", "upper", "n", "threshold", "setting", "seeds", "run"]),
        "replication": False, "verdict": NOT_MEASURED, "reason": "no finished run",
    }  # fmt: skip


def _with(
    base: dict[str, Any], preset: str, run: RunRecord | None, verdict: Verdict | None
) -> dict[str, Any]:
    out = {**base, "preset": preset}
    if run is None:
        return out
    out.update(run=run, seeds=run.seed_count, setting=run_setting(run) or None)
    out["reason"] = "the finished run holds no number for it"
    if verdict is not None:
        finite = not math.isnan(verdict.value)
        out.update(
            ours=verdict.value if finite else None, lower=verdict.lower if finite else None,
            upper=verdict.upper if finite else None, n=verdict.n, verdict=verdict.verdict,
            reason=verdict.reason, threshold=None if math.isnan(verdict.threshold) else verdict.threshold,
        )  # fmt: skip
    return out


def claims_table(records: list[RunRecord]) -> pd.DataFrame:
    """Return one row per claim, metric version, preset and run, with each current claim's overall verdict."""
    paper = paper_numbers()
    specs = claim_specs()
    current = {s.id: s for s in specs if s.current}
    first: dict[tuple[str, str], Verdict | None] = {}  # (claim id, preset) -> the answering run's verdict
    rows: list[dict[str, Any]] = []
    for spec in sorted(
        specs, key=lambda s: s.estimator == "joint"
    ):  # joint claims read their parts' verdicts
        base = _base(spec, paper)
        value = base["paper_value"]
        for preset in spec.presets:
            runs = _answering(records, spec, preset)
            if spec.estimator == "joint":
                parts = {current[p].label: first.get((p, preset)) for p in spec.parts}
                verdict = judge_joint(spec, parts)
                rows.append(_with(base, preset, runs[0] if runs else None, verdict))
                first[(spec.id, preset)] = verdict
                continue
            if not runs:
                rows.append(_with(base, preset, None, None))
                continue
            for i, run in enumerate(runs):
                verdict = _verdict(spec, run, value)
                rows.append({**_with(base, preset, run, verdict), "replication": i > 0})
                if i == 0 and spec.current:
                    first[(spec.id, preset)] = verdict
    table = pd.DataFrame(rows)
    decisions = {s.id: overall(s, {p: first.get((s.id, p)) for p in s.presets}) for s in current.values()}
    table["overall"] = [
        decisions[i][0] if s == "current" else SUPERSEDED for i, s in zip(table.id, table.status, strict=True)
    ]
    table["overall_reason"] = [decisions[i][1] for i in table.id]
    table["decides"] = [
        s == "current" and not rep and decisions[i][2] == p
        for i, s, rep, p in zip(table.id, table.status, table.replication, table.preset, strict=True)
    ]
    order = {s.id: n for n, s in enumerate(current.values())}
    table["_family"] = table["family"].map(lambda f: FAMILIES.index(f) if f in FAMILIES else len(FAMILIES))
    table["_claim"] = table["id"].map(order)
    table["_status"] = (table["status"] != "current").astype(int)
    return (
        table.sort_values(["_family", "_claim", "_status", "version"], ascending=[True, True, True, False],
                          kind="stable")
        .drop(columns=["_family", "_claim", "_status"])
        .reset_index(drop=True)
    )  # fmt: skip


def claimed_paper_rows(paper: pd.DataFrame) -> set[int]:
    """Return the indices of the paper rows some claim tests."""
    used: set[int] = set()
    for spec in claim_specs():
        used |= paper_row(paper, spec)[3]
    return used


def counts(table: pd.DataFrame) -> dict[str, int]:
    """Return how many current claims there are, how many were measured, and each overall verdict's count."""
    claims = table[table["status"] == "current"].drop_duplicates("id")
    out = {"claims": len(claims), "measured": int((claims["overall"] != NOT_MEASURED).sum())}
    for outcome in claims["overall"]:
        out[outcome] = out.get(outcome, 0) + 1
    return out


def spec_markdown() -> str:
    """Return the claims specification as a Markdown table (the one in docs/claims.md), current metrics first."""
    lines = [
        "| Claim | Presets | Metric | Estimator | Holds when | Seeds | Paper's setting |",
        "|---|---|---|---|---|---|---|",
    ]
    specs = sorted(claim_specs(), key=lambda s: not s.current)
    for s in specs:
        name = s.label + ("" if s.current else f" (earlier metric, v{s.version})")
        holds = f"ours {s.direction} {s.threshold}" if s.estimator != "joint" else " and ".join(s.parts)
        seeds = str(s.min_seeds) if s.estimator != "joint" else "its parts'"
        cells = [name, ", ".join(s.presets), s.window, f"`{s.estimator}`", holds, seeds, s.paper_setting]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
