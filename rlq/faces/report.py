"""The reproduction report: which of the papers' claims hold in our runs, and on what evidence.

``rlq report`` writes ``runs/report.html`` (one self-contained page: the verdicts first, a forest plot
per claim family, then the papers' settings, later work and the runs) and prints the verdicts as text;
``--format md`` also writes them as a Markdown table (``runs/report.md``). Every claim of ``data/claims.csv``
is judged on every preset that measured it, among the run folders under ``runs/`` and the published results
under ``data/results/`` (:mod:`rlq.faces.report_claims`); :mod:`rlq.claims.verdicts` holds the rule on a
preset and across presets. No machine path appears in the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from rlq.claims.verdicts import OUTCOMES
from rlq.core.jsonio import read_json
from rlq.experiments.paper import paper_numbers
from rlq.experiments.paths import data_dir, repo_root
from rlq.experiments.results import variant_params
from rlq.experiments.run_folders import NOTEBOOK_FILE, PARAMS_FILE, RESULTS_FILE, list_runs, run_state
from rlq.experiments.sweeps import sweep_points
from rlq.faces.report_claims import NOT_MEASURED, claimed_paper_rows, claims_table, counts, partner_metric
from rlq.faces.report_text import Paths, duration, interval, paper_text

__all__ = [
    "NOT_MEASURED",
    "RunRecord",
    "build_report",
    "claims_table",
    "collect_runs",
    "counts",
    "runs_table",
]


@dataclass
class RunRecord:
    """One run folder or published result, as the report sees it."""

    experiment: str
    preset: str | None
    status: str
    path: Path
    published: bool
    params: dict[str, Any]
    results: dict[str, Any]

    @property
    def seeds(self) -> str:
        """Return the seed(s) the run used, as text."""
        for key in ("seeds", "seed"):
            if key in self.params:
                return str(self.params[key])
        return "?"

    @property
    def seed_count(self) -> int | None:
        """Return how many seeds the run used (a ``seeds`` list or count, or one ``seed``), None if unknown."""
        seeds = self.params.get("seeds")
        if isinstance(seeds, list):
            return len(seeds)
        if isinstance(seeds, int) and not isinstance(seeds, bool):
            return seeds
        return 1 if "seed" in self.params else None

    @property
    def variant_of_preset(self) -> list[str]:
        """Return the parameters in which the run departs from its preset, e.g. an ablation (:func:`variant_params`).

        A run folder that is a variant answers no claim of its preset. Unknown experiments and parameters the
        notebook has gained since are not held against a run; a published result whose preset has changed
        since it was published still answers (it is what the preset was), and the runs table says so.
        """
        return variant_params(self.experiment, self.preset, self.params)

    @property
    def reused_text(self) -> str:
        """Return how many of the run's runs were loaded from earlier folders (``--reuse``) and their training time."""
        reused = self.results.get("reused") or []
        if not reused:
            return ""
        runs = sum(int(entry.get("runs", 0)) for entry in reused)
        seconds = [entry.get("train_seconds") for entry in reused]
        text = f"{runs} runs loaded from {len(reused)} earlier folder{'s' if len(reused) > 1 else ''}"
        if all(isinstance(t, (int, float)) for t in seconds):
            text += f", which trained for {' + '.join(duration(float(t)) for t in seconds)}"
        return text

    @property
    def notebook(self) -> Path | None:
        """Return the run's executed notebook, or None (published results keep none)."""
        path = self.path / NOTEBOOK_FILE
        return path if path.is_file() else None

    def _attempts(self) -> list[dict[str, Any]]:
        folders = sorted(
            (self.path / "attempts").glob("*/"), key=lambda p: int(p.name) if p.name.isdigit() else 0
        )
        attempts = []
        for folder in (f for f in folders if (f / RESULTS_FILE).is_file()):
            try:
                attempts.append(read_json(folder / RESULTS_FILE))
            except ValueError:  # a damaged archived attempt counts for nothing; the current results stand
                continue
        return attempts

    @property
    def reanalysed(self) -> bool:
        """Return True when the current results come from a ``--rerun`` of a finished attempt."""
        return any(a.get("status") == "ok" for a in self._attempts())

    @property
    def train_seconds(self) -> float | None:
        """Return the seconds the run spent training: ``train_seconds``, else the attempts that trained.

        Runs made before ``train_seconds`` existed: the attempts' ``run_seconds`` up to the first that
        finished (later ones re-analysed its checkpoints).
        """
        if self.results.get("train_seconds") is not None:
            return float(self.results["train_seconds"])
        total = None
        for attempt in [*self._attempts(), self.results]:
            if attempt.get("run_seconds") is not None:
                total = (total or 0.0) + float(attempt["run_seconds"])
            if attempt.get("status") == "ok":
                break
        return total


UNREADABLE = "unreadable"
"""The status of a run folder or published result whose results.json or params.json is damaged."""


def collect_runs(runs_dir: str | Path, results_dir: str | Path | None = None) -> list[RunRecord]:
    """Return every run under ``runs_dir`` and every published result under ``results_dir`` (damaged: unreadable)."""
    records = []
    for path in [*list_runs(runs_dir), *sweep_points(runs_dir)]:  # a sweep's points are ordinary runs
        try:
            results, params = read_json(path / RESULTS_FILE), read_json(path / PARAMS_FILE)
        except ValueError as e:  # a damaged file: listed as unreadable, the report goes on
            records.append(RunRecord(path.parent.name, None, UNREADABLE, path, False, {}, {"error": str(e)}))
            continue
        state = run_state(path, results)  # a killed run shows as interrupted, not running
        experiment = results.get("experiment") or path.parent.name
        records.append(RunRecord(experiment, results.get("preset"), state, path, False, params, results))
    results_dir = Path(results_dir) if results_dir is not None else data_dir() / "results"
    for path in sorted(results_dir.glob(f"*/*/{RESULTS_FILE}")):
        folder = path.parent
        try:
            results, params = read_json(path), read_json(folder / PARAMS_FILE)
        except ValueError as e:
            records.append(
                RunRecord(folder.parent.name, folder.name, UNREADABLE, folder, True, {}, {"error": str(e)})
            )
            continue
        if results.get(
            "confirmatory"
        ):  # the registered design's runs: judged by rlq campaign, not by these rules
            continue
        status = results.get("status", "unknown")
        records.append(RunRecord(folder.parent.name, folder.name, status, folder, True, params, results))
    return records


def _merge_ranges(frame: pd.DataFrame) -> pd.DataFrame:
    """Return ``frame`` with each ``x_min``/``x_max`` pair as one row ``x`` whose value reads ``low to high``."""
    keys = (
        frame[["paper", "experiment", "algorithm", "environment"]]
        .fillna("")
        .astype(str)
        .agg("|".join, axis=1)
    )
    rows, skip = [], set()
    for index, row in frame.iterrows():
        if index in skip:
            continue
        metric, value = row["metric"], paper_text(row["value"])
        if metric.endswith("_min"):
            match = frame[
                (frame["metric"] == partner_metric(metric)) & (keys == keys[index]) & (frame.index > index)
            ]
            match = match[~match.index.isin(skip)]
            if not match.empty:
                skip.add(match.index[0])
                low, high = sorted([float(row["value"]), float(match["value"].iloc[0])])
                metric, value = metric.removesuffix("_min"), paper_text(low, low, high)
        rows.append({**row.to_dict(), "metric": metric.replace("_", " "), "value": value})
    return pd.DataFrame(rows, columns=frame.columns)


def paper_sections(paper: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return the papers' rows that no claim tests: (what the papers used, what later work reports)."""
    paper = paper_numbers() if paper is None else paper
    rest = paper[~paper.index.isin(claimed_paper_rows(paper))]
    later = rest["experiment"] == "later_work"
    columns = ["paper", "experiment", "algorithm", "environment", "metric", "value", "unit", "note"]
    used = _merge_ranges(rest[~later])[columns]
    return used, _merge_ranges(rest[later])[
        ["paper", "algorithm", "environment", "metric", "value", "unit", "note"]
    ]


def runs_table(records: list[RunRecord], paths: Paths) -> pd.DataFrame:
    """Return every run with its status, training time (of the attempt that trained) and folder."""
    rows = []
    for r in records:
        status = (
            f"{r.status}, re-analysed" if r.status == "ok" and not r.published and r.reanalysed else r.status
        )
        variant = r.variant_of_preset
        if variant:
            kind = "preset changed since in" if r.published else "variant of its preset in"
            status += f" ({kind}: {', '.join(variant)})"
        status = "published" if r.published and r.status == "ok" else status
        if r.reused_text:  # the training time is this folder's own; its reused runs trained elsewhere
            status += f" ({r.reused_text})"
        rows.append(
            {
                "experiment": r.experiment,
                "preset": r.preset,
                "status": status,
                "seeds": r.seeds,
                "train_seconds": r.train_seconds,
                "error": paths.scrub(str(r.results.get("error") or "")),
                "folder": paths.label(r.path),
                "link": paths.link(r.path),
            }
        )
    columns = ["experiment", "preset", "status", "seeds", "train_seconds", "error", "folder", "link"]
    return pd.DataFrame(rows, columns=columns)


def summary_line(table: pd.DataFrame, runs: pd.DataFrame) -> str:
    """Return the one-line summary: claims measured, each overall verdict's count, runs and failures."""
    c = counts(table)
    plural = {"holds": "hold", "does not hold": "do not hold"}
    tally = ", ".join(f"{c[o]} {plural.get(o, o)}" for o in (*OUTCOMES, NOT_MEASURED) if c.get(o))
    failed = int((runs["status"] == "failed").sum())
    return f"{c['claims']} claims, {c['measured']} measured: {tally}; {len(runs)} runs ({failed} failed)"


def ours_text(row: Any) -> str:
    """Return our number of a claim row with its interval and unit, ``""`` when not measured."""
    return "" if row.ours is None or pd.isna(row.ours) else interval(row.ours, row.lower, row.upper, row.unit)


def seeds_text(row: Any) -> str:
    """Return the seeds (or seed pairs) behind our number and the claim's minimum, e.g. ``5/10``."""
    for count in (row.n, row.seeds):
        if count is not None and not pd.isna(count):
            return f"{int(count)}/{int(row.min_seeds)}"
    return ""


def claim_text(row: Any) -> str:
    """Return the claim's name on a row: a superseded metric and a replication say so."""
    text = f"{row.family}: {row.claim}"
    if row.status != "current":
        text += f" (earlier metric, v{row.version})"
    if row.replication:
        text += " (replication)"
    return text


def overall_text(row: Any) -> str:
    """Return the claim's verdict across presets with the rule's reason (superseded rows: superseded)."""
    if row.status != "current":
        return "superseded"
    return f"{row.overall} ({row.overall_reason})"


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _first_of_claim(table: pd.DataFrame) -> pd.Series:
    """Return True on the first row of each claim and metric version (where its name and verdict are shown)."""
    return ~table.duplicated(["id", "version"])


def text_report(table: pd.DataFrame, runs: pd.DataFrame) -> str:
    """Return the verdicts as plain text: the summary line, then each claim on each preset that measured it."""
    lines = [summary_line(table, runs)]
    rows = [["claim", "paper", "preset", "ours [95% interval]", "seeds", "on the preset", "claim's verdict"]]
    for r, first in zip(table.itertuples(), _first_of_claim(table), strict=True):
        if r.verdict == NOT_MEASURED and not first:
            continue
        rows.append([
            claim_text(r) if first else "", paper_text(r.paper_value, r.paper_low, r.paper_high, r.unit),
            r.preset or "", ours_text(r), seeds_text(r), r.verdict, overall_text(r) if first else "",
        ])  # fmt: skip
    return "\n".join([*lines, *_columns(rows), *unreadable_lines(runs)])


def unreadable_lines(runs: pd.DataFrame) -> list[str]:
    """Return one line per run folder or published result the report skipped as unreadable, with the damage."""
    skipped = runs[runs["status"] == UNREADABLE]
    return [f"skipped, unreadable: {r.folder} ({r.error})" for r in skipped.itertuples()]


def _preset_cell(row: Any) -> str:
    """Return one preset's entry of a claim's Markdown row: the preset, our number, seeds and its outcome."""
    preset = f"{row.preset} ({row.setting})" if isinstance(row.setting, str) and row.setting else row.preset
    if row.joint or row.verdict == NOT_MEASURED:
        parts = f" ({row.reason})" if row.joint and row.verdict != NOT_MEASURED else ""
        return f"{row.preset}: **{row.verdict}**{parts}"
    n = seeds_text(row).split("/")
    seeds = f" (n = {n[0]}; needs {n[1]})" if len(n) == 2 else ""
    return f"{preset}: {ours_text(row)}{seeds}, **{row.verdict}**"


def markdown_report(table: pd.DataFrame, runs: pd.DataFrame) -> str:
    """Return the verdict table in Markdown, fit for a README: each current claim on every preset, side by side.

    Each preset names what its run measured on (tasks, budget, scenario, data); the paper's setting of each
    claim is in ``data/claims.csv``. Superseded metrics and replications are in the text and HTML reports.
    """
    lines = [
        f"**{summary_line(table, runs)}**",
        "",
        "| Claim | Paper | Ours on each preset [95% interval] | Claim's verdict |",
        "|---|---|---|---|",
    ]
    current = table[(table["status"] == "current") & ~table["replication"]]
    for _, rows in current.groupby("id", sort=False):
        first = next(rows.itertuples())
        cells = [
            f"{first.family}: {first.claim}",
            paper_text(first.paper_value, first.paper_low, first.paper_high, first.unit),
            "<br>".join(_preset_cell(r) for r in rows.itertuples()),
            f"{first.overall} ({_short(first.overall_reason)})",
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _short(reason: Any) -> str:
    """Return the first clause of a verdict's reason, for a table cell a reader scans."""
    return _first_clause(str(reason).split("; ")[0]) if isinstance(reason, str) else ""


def _first_clause(text: str) -> str:
    """Return ``text`` up to its first ": " outside parentheses (a parenthesis such as "(paper: ...)" stays whole)."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and text.startswith(": ", i):
            return text[:i]
    return text


def _project_root() -> Path | None:
    try:
        return repo_root()
    except FileNotFoundError:
        return None


def build_report(
    runs_dir: str | Path = "runs",
    out: str | Path | None = None,
    results_dir: str | Path | None = None,
    formats: tuple[str, ...] = ("html",),
) -> tuple[Path, str]:
    """Return the path of the written HTML report and its verdicts as text; ``"md"`` in ``formats`` also
    writes the Markdown verdict table beside it (same name, ``.md``)."""
    from rlq.faces.report_html import render_page

    runs_dir = Path(runs_dir)
    out = Path(out) if out is not None else runs_dir / "report.html"
    if out.is_dir():  # a folder: the report goes into it
        out = out / "report.html"
    paths = Paths(out, _project_root())
    records = collect_runs(runs_dir, results_dir)
    claims, runs = claims_table(records), runs_table(records, paths)
    used, later = paper_sections()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_page(claims, runs, used, later, paths))
    if "md" in formats:
        out.with_suffix(".md").write_text(markdown_report(claims, runs))
    return out, text_report(claims, runs)
