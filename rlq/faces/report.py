"""The reproduction report: which of the papers' claims hold in our runs, and on what evidence.

``rlq report`` writes ``runs/report.html`` (one self-contained page: the verdicts first, a forest plot
per claim family, then the papers' settings, later work and the runs) and prints the verdicts as text;
``--format md`` also writes them as a Markdown table (``runs/report.md``). Our number for a claim comes
from the best finished run of its experiment: the largest preset (paper, then medium, then quick), newest
first, among the run folders under ``runs/`` and the published results under ``data/results/``;
:func:`rlq.experiments.claims.judge` says whether it holds. No machine path appears in the output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from rlq.core.jsonio import read_json
from rlq.experiments.claims import CLAIMS, FAMILIES, VERDICTS, Claim, judge, our_estimate
from rlq.experiments.paper import paper_numbers
from rlq.experiments.paths import data_dir, repo_root
from rlq.experiments.results import variant_params
from rlq.experiments.run_folders import NOTEBOOK_FILE, PARAMS_FILE, RESULTS_FILE, list_runs, run_state
from rlq.experiments.sweeps import sweep_points
from rlq.faces.report_text import Paths, duration, interval, paper_text

PRESET_RANK = {"paper": 3, "long": 2.5, "medium": 2, "quick": 1}
"""A claim is judged on its largest finished preset: ``long`` (a preset some experiments add, between their
``medium`` and ``paper`` budgets) beats ``medium``; a variant's name (an ablation) ranks below every preset."""
NOT_MEASURED = "not measured"


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
        status = results.get("status", "unknown")
        records.append(RunRecord(folder.parent.name, folder.name, status, folder, True, params, results))
    return records


def best_run(
    records: list[RunRecord], experiment: str, answers: Callable[[RunRecord], bool] | None = None
) -> RunRecord | None:
    """Return the finished run of ``experiment`` with the largest preset, newest first; variants never.

    With ``answers``, a run that answers (e.g. holds the claim's number) wins over one that does not.
    """
    done = [
        r
        for r in records
        if r.experiment == experiment and r.status == "ok" and (r.published or not r.variant_of_preset)
    ]
    done.sort(key=lambda r: (PRESET_RANK.get(r.preset or "", 0), str(r.results.get("finished", ""))))
    answering = [r for r in done if answers(r)] if answers is not None else []
    return (answering or done or [None])[-1]


def _partner(metric: str) -> str | None:
    for end, other in (("_min", "_max"), ("_max", "_min")):
        if metric.endswith(end):
            return metric[: -len(end)] + other
    return None


def _paper_row(paper: pd.DataFrame, claim: Claim) -> tuple[pd.Series, float | None, float | None, set[int]]:
    """Return the claim's paper row, the paper's range (low, high) if it reports one, and the rows used."""
    same = paper[(paper["paper"] == claim.paper) & (paper["experiment"] == claim.experiment)]
    rows = same[same["metric"] == claim.metric]
    if rows.empty:
        raise LookupError(f"claim {claim.paper}/{claim.experiment}/{claim.metric} has no row in data/paper")
    row, used = rows.iloc[0], {int(rows.index[0])}
    partner = _partner(claim.metric)
    other = same[same["metric"] == partner] if partner else same.iloc[0:0]
    if other.empty:
        return row, None, None, used
    used.add(int(other.index[0]))
    pair = sorted([float(row["value"]), float(other["value"].iloc[0])])
    return row, pair[0], pair[1], used


def claim_label(claim: Claim) -> str:
    """Return a short name of the claim: its paper setting and metric in words."""
    metric = claim.metric
    for end in ("_min", "_max"):
        metric = metric.removesuffix(end)
    return f"{claim.experiment}: {metric.replace('_', ' ')}"


def _claim_row(claim: Claim, paper: pd.DataFrame, records: list[RunRecord]) -> dict[str, Any]:
    row, low, high, _ = _paper_row(paper, claim)
    out: dict[str, Any] = {
        "family": claim.family,
        "claim": claim_label(claim),
        "paper": claim.paper,
        "experiment": claim.experiment,
        "metric": claim.metric,
        "unit": claim.unit,
        "rule": claim.rule,
        "paper_value": float(row["value"]),
        "paper_low": low,
        "paper_high": high,
        "ours_experiment": claim.ours_experiment,
        **dict.fromkeys(["ours", "lower", "upper", "n", "threshold", "setting", "preset", "seeds", "run"]),
        "verdict": NOT_MEASURED,
        "reason": "no finished run",
    }
    run = best_run(records, claim.ours_experiment, lambda r: our_estimate(claim, r.results) is not None)
    if run is None:
        return out
    out.update(
        preset=run.preset, seeds=run.seed_count, run=run, reason="the finished run holds no number for it"
    )
    verdict = judge(claim, run.results, float(row["value"]))
    if verdict is not None:
        out.update(
            ours=verdict.value,
            lower=verdict.lower,
            upper=verdict.upper,
            n=verdict.n,
            threshold=verdict.threshold,
            setting=verdict.setting,
            verdict=verdict.verdict,
            reason=verdict.reason,
        )
    return out


def _family_order(family: str) -> int:
    return FAMILIES.index(family) if family in FAMILIES else len(FAMILIES)


def claims_table(records: list[RunRecord]) -> pd.DataFrame:
    """Return one row per claim: the paper's value or range, ours with its interval, and the verdict."""
    paper = paper_numbers()
    table = pd.DataFrame([_claim_row(claim, paper, records) for claim in CLAIMS])
    order = table["family"].map(_family_order)
    return table.assign(_order=order).sort_values("_order", kind="stable").drop(columns="_order")


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
                (frame["metric"] == _partner(metric)) & (keys == keys[index]) & (frame.index > index)
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
    claimed: set[int] = set()
    for claim in CLAIMS:
        claimed |= _paper_row(paper, claim)[3]
    rest = paper[~paper.index.isin(claimed)]
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


def counts(table: pd.DataFrame) -> dict[str, int]:
    """Return how many claims there are, how many were measured, and how many got each verdict."""
    out = {"claims": len(table), "measured": int((table["verdict"] != NOT_MEASURED).sum())}
    out.update({v: int((table["verdict"] == v).sum()) for v in VERDICTS})
    out["another setting"] = int((table["setting"].notna() & (table["verdict"] != NOT_MEASURED)).sum())
    return out


def summary_line(table: pd.DataFrame, runs: pd.DataFrame) -> str:
    """Return the one-line summary: claims measured, verdict counts, runs and failures."""
    c = counts(table)
    setting = f" ({c['another setting']} in another setting)" if c["another setting"] else ""
    failed = int((runs["status"] == "failed").sum())
    return (
        f"{c['measured']} of {c['claims']} claims measured: {c['holds']} hold, {c['does not hold']} do not hold, "
        f"{c['inconclusive']} inconclusive{setting}; {len(runs)} runs ({failed} failed)"
    )


def ours_text(row: Any) -> str:
    """Return our number of a claim row with its interval and unit, ``""`` when not measured."""
    return "" if row.ours is None or pd.isna(row.ours) else interval(row.ours, row.lower, row.upper, row.unit)


def seeds_text(row: Any) -> str:
    """Return the number of seeds behind our number, else how many seeds the run used."""
    for count in (row.n, row.seeds):
        if count is not None and not pd.isna(count):
            return str(int(count))
    return ""


def verdict_text(row: Any) -> str:
    """Return the verdict with its reason and, when the run is not comparable, why."""
    parts = [row.reason] if row.reason else []
    if row.setting:
        parts.append(row.setting)
    return f"{row.verdict} ({'; '.join(parts)})" if parts else row.verdict


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def text_report(table: pd.DataFrame, runs: pd.DataFrame) -> str:
    """Return the verdicts as plain text: the summary line, one line per measured claim, the rest named."""
    lines = [summary_line(table, runs)]
    measured = table[table["verdict"] != NOT_MEASURED]
    if len(measured):
        rows = [["verdict", "claim", "paper", "ours [95% interval]", "seeds", "preset"]]
        rows += [
            [
                r.verdict,
                f"{r.family}: {r.claim}",
                paper_text(r.paper_value, r.paper_low, r.paper_high, r.unit),
                ours_text(r),
                seeds_text(r),
                r.preset or "",
            ]
            for r in measured.itertuples()
        ]
        lines += _columns(rows)
    missing = table[table["verdict"] == NOT_MEASURED]
    if len(missing):
        lines.append(
            "not measured: " + "; ".join(f"{r.family}: {r.claim} ({r.reason})" for r in missing.itertuples())
        )
    return "\n".join(lines + unreadable_lines(runs))


def unreadable_lines(runs: pd.DataFrame) -> list[str]:
    """Return one line per run folder or published result the report skipped as unreadable, with the damage."""
    skipped = runs[runs["status"] == UNREADABLE]
    return [f"skipped, unreadable: {r.folder} ({r.error})" for r in skipped.itertuples()]


def markdown_report(table: pd.DataFrame, runs: pd.DataFrame) -> str:
    """Return the verdict table in Markdown, fit for a README or a pull request."""
    lines = [
        f"**{summary_line(table, runs)}**",
        "",
        "| Claim | Paper | Ours [95% interval] | Seeds | Preset | Verdict |",
        "|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        cells = [
            f"{r.family}: {r.claim}",
            paper_text(r.paper_value, r.paper_low, r.paper_high, r.unit),
            ours_text(r) or "–",
            seeds_text(r) if r.verdict != NOT_MEASURED else "",
            r.preset or "",
            f"**{r.verdict}**" + (f" ({'; '.join(p for p in _short(r.reason, r.setting) if p)})"),
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _short(reason: Any, setting: Any) -> tuple[str, str]:
    """Return the first clause of a verdict's reason and of its setting note, for a table cell a reader scans."""
    first = str(reason).split("; ")[0] if isinstance(reason, str) else ""
    note = _first_clause(setting) if isinstance(setting, str) else ""
    return first, note


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
