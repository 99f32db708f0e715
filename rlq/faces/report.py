"""The reproduction report: every paper number beside ours, from run folders and committed results.

``rlq report`` writes ``runs/report.html`` (tables and Plotly figures in one self-contained page) and
prints the claims table as text. Our number for a claim comes from the best finished run of its
experiment: the largest preset (paper, then medium, then quick), newest first, among the run folders
under ``runs/`` and the published results under ``data/results/``. Failed runs are listed as failed.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from rlq.core.jsonio import read_json
from rlq.experiments.claims import CLAIMS, Claim
from rlq.experiments.paper import paper_numbers
from rlq.experiments.paths import data_dir
from rlq.experiments.runs import PARAMS_FILE, RESULTS_FILE, list_runs, run_state

PRESET_RANK = {"paper": 3, "medium": 2, "quick": 1}


@dataclass
class RunRecord:
    """One run folder or published result, as the report sees it."""

    experiment: str
    preset: str | None
    status: str
    source: str
    params: dict[str, Any]
    results: dict[str, Any]

    @property
    def seeds(self) -> str:
        """Return the seed(s) the run used, as text."""
        for key in ("seeds", "seed"):
            if key in self.params:
                return str(self.params[key])
        return "?"


def collect_runs(runs_dir: str | Path, results_dir: str | Path | None = None) -> list[RunRecord]:
    """Return every run under ``runs_dir`` and every published result under ``results_dir``."""
    records = []
    for path in list_runs(runs_dir):
        results = read_json(path / RESULTS_FILE)
        records.append(
            RunRecord(
                results.get("experiment") or path.parent.name,
                results.get("preset"),
                run_state(path, results),  # a killed run shows as interrupted, not running
                str(path),
                read_json(path / PARAMS_FILE),
                results,
            )
        )
    results_dir = Path(results_dir) if results_dir is not None else data_dir() / "results"
    for path in sorted(results_dir.glob(f"*/*/{RESULTS_FILE}")):
        results = read_json(path)
        records.append(
            RunRecord(
                path.parent.parent.name,
                path.parent.name,
                results.get("status", "unknown"),
                f"published: {path.parent}",
                read_json(path.parent / PARAMS_FILE),
                results,
            )
        )
    return records


def best_run(records: list[RunRecord], experiment: str) -> RunRecord | None:
    """Return the finished run of ``experiment`` with the largest preset, newest first."""
    done = [r for r in records if r.experiment == experiment and r.status == "ok"]
    done.sort(key=lambda r: (PRESET_RANK.get(r.preset or "", 0), str(r.results.get("finished", ""))))
    return done[-1] if done else None


def _claim_for(row: pd.Series) -> Claim | None:
    for claim in CLAIMS:
        if (claim.paper, claim.experiment, claim.metric) == (row["paper"], row["experiment"], row["metric"]):
            return claim
    return None


def claims_table(records: list[RunRecord]) -> pd.DataFrame:
    """Return one row per paper number: the paper's value, ours, where ours came from, and whether it holds."""
    rows = []
    for _, paper in paper_numbers().iterrows():
        claim = _claim_for(paper)
        row = {
            "paper": paper["paper"],
            "experiment": paper["experiment"],
            "metric": paper["metric"],
            "environment": paper["environment"],
            "paper_value": paper["value"],
            "unit": paper["unit"],
            "ours": None,
            "our_experiment": None,
            "preset": None,
            "seeds": None,
            "source": None,
            "rule": None,
            "holds": "not measured",
        }
        if claim is not None:
            row.update(our_experiment=claim.ours_experiment, rule=claim.rule)
            run = best_run(records, claim.ours_experiment)
            value = claim.ours(run.results) if run is not None else None
            if value is not None:
                other = claim.setting(run.results)
                verdict = "yes" if claim.holds(value, float(paper["value"])) else "no"
                row.update(
                    ours=value,
                    preset=run.preset,
                    seeds=run.seeds,
                    source=run.source,
                    holds=f"{verdict} ({other})" if other else verdict,
                )
            elif run is not None:
                # the run finished but did not produce the number (e.g. no run reached the return threshold)
                row.update(preset=run.preset, seeds=run.seeds, source=run.source)
                row["holds"] = "no value in the finished run"
            else:
                row["holds"] = "no finished run"
        rows.append(row)
    return pd.DataFrame(rows)


def runs_table(records: list[RunRecord]) -> pd.DataFrame:
    """Return every run with its status (failed runs included, with their error)."""
    return pd.DataFrame(
        [
            {
                "experiment": r.experiment,
                "preset": r.preset,
                "status": r.status,
                "seeds": r.seeds,
                "seconds": r.results.get("run_seconds"),
                "error": r.results.get("error", ""),
                "source": r.source,
            }
            for r in records
        ],
        columns=["experiment", "preset", "status", "seeds", "seconds", "error", "source"],
    )


def claims_figure(table: pd.DataFrame) -> go.Figure:
    """Return a grouped bar chart of paper vs ours for every measured claim."""
    measured = table[table["ours"].notna()]
    labels = [f"{r.paper}: {r.experiment} {r.metric}" for r in measured.itertuples()]
    fig = go.Figure()
    fig.add_bar(x=labels, y=measured["paper_value"], name="paper")
    fig.add_bar(x=labels, y=measured["ours"], name="rlq")
    fig.update_layout(barmode="group", title="Paper vs rlq (measured claims)", template="plotly_white")
    return fig


def _text_table(table: pd.DataFrame) -> str:
    shown = table[["paper", "experiment", "metric", "paper_value", "unit", "ours", "preset", "holds"]].copy()
    shown["ours"] = shown["ours"].map(lambda v: "" if v is None or pd.isna(v) else f"{v:.4g}")
    return shown.fillna("").to_string(index=False)


def build_report(
    runs_dir: str | Path = "runs", out: str | Path | None = None, results_dir: str | Path | None = None
) -> tuple[Path, str]:
    """Return the path of the written HTML report and its claims table as text."""
    runs_dir = Path(runs_dir)
    out = Path(out) if out is not None else runs_dir / "report.html"
    records = collect_runs(runs_dir, results_dir)
    claims, runs = claims_table(records), runs_table(records)
    measured = claims[claims["ours"].notna()]
    verdicts = measured["holds"].astype(str)
    summary = (
        f"{len(claims)} paper numbers; {len(measured)} measured by rlq, {int(verdicts.str.startswith('yes').sum())} "
        f"hold ({int((verdicts.str.startswith('yes') & (verdicts != 'yes')).sum())} of them in another setting); "
        f"{len(runs)} runs ({int((runs['status'] == 'failed').sum())} failed)"
    )
    parts = [
        "<html><head><meta charset='utf-8'><title>rlq reproduction report</title>",
        "<style>body{font-family:sans-serif;margin:2em} table{border-collapse:collapse;font-size:13px}"
        " td,th{border:1px solid #ccc;padding:3px 6px} .no{background:#fdd} .yes{background:#dfd}</style>",
        "</head><body><h1>rlq reproduction report</h1>",
        f"<p>{html.escape(summary)}</p>",
        "<h2>Paper claims</h2>",
        claims.to_html(index=False, na_rep="", classes="claims", escape=True),
    ]
    if len(measured):
        parts.append(claims_figure(claims).to_html(full_html=False, include_plotlyjs="inline"))
    parts += ["<h2>Runs</h2>", runs.to_html(index=False, na_rep="", escape=True), "</body></html>"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts))
    return out, f"{summary}\n{_text_table(claims)}"
