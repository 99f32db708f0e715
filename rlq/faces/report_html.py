"""The report page: verdicts first, a forest plot per claim family, then settings, later work and runs."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

from rlq.claims.verdicts import OUTCOMES
from rlq.faces.report import (
    NOT_MEASURED,
    claim_text,
    counts,
    ours_text,
    overall_text,
    seeds_text,
    summary_line,
)
from rlq.faces.report_figures import family_figures
from rlq.faces.report_text import Paths, duration, paper_text

CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;font-size:14px;color:#1f2328;margin:0}
main{max-width:1180px;margin:0 auto;padding:12px 20px 40px}
h1{font-size:22px;margin:4px 0 8px} h2{font-size:17px;margin:26px 0 8px}
.meta{color:#57606a;margin:0 0 10px}
.counts{display:flex;gap:10px;flex-wrap:wrap;margin:0 0 12px}
.count{border:1px solid #d0d7de;border-radius:8px;padding:6px 14px;min-width:110px}
.count b{display:block;font-size:22px}
.count.holds b{color:#1a7f37} .count.fails b{color:#cf222e} .count.inconclusive b{color:#9a6700}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid #d8dee4;padding:5px 8px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#f6f8fa;font-weight:600;white-space:nowrap}
td.num,td.short{white-space:nowrap} td.claim{width:34%} td.why{width:30%}
.badge{display:inline-block;border-radius:10px;padding:1px 9px;font-weight:600;color:#fff;white-space:nowrap}
.badge.holds{background:#1a7f37} .badge.fails{background:#cf222e}
.badge.inconclusive{background:#9a6700} .badge.unmeasured{background:#8c959f}
.badge.few{background:#6e7781} .badge.design{background:#0969da} .badge.ceiling{background:#8250df}
tr.later td{border-top:none} tr.superseded td{color:#57606a}
.why{color:#57606a;font-size:12px}
.rule{color:#57606a;font-size:12px;display:block}
details{margin:14px 0;border:1px solid #d0d7de;border-radius:8px;padding:6px 12px}
summary{cursor:pointer;font-weight:600;font-size:15px}
.figure{margin:6px 0 18px}
"""

BADGE = {
    "holds": "holds",
    "does not hold": "fails",
    "inconclusive": "inconclusive",
    "too few seeds": "few",
    "by design": "design",
    "uninformative (ceiling)": "ceiling",
    "superseded": "unmeasured",
}


def _e(value: Any) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    return html.escape(str(value))


def _badge(verdict: str) -> str:
    return f"<span class='badge {BADGE.get(verdict, 'unmeasured')}'>{_e(verdict)}</span>"


def _link(href: str | None, text: str) -> str:
    return f"<a href='{_e(href)}'>{_e(text)}</a>" if href else _e(text)


def _counts_html(table: pd.DataFrame) -> str:
    c = counts(table)
    boxes = [("measured", f"{c['measured']} / {c['claims']}", "claims measured")]
    boxes += [(BADGE[v], str(c.get(v, 0)), v) for v in OUTCOMES if c.get(v)]
    cells = "".join(f"<div class='count {cls}'><b>{_e(n)}</b>{_e(label)}</div>" for cls, n, label in boxes)
    return f"<div class='counts' id='verdict-counts'>{cells}</div>"


def _evidence_link(row: Any, paths: Paths) -> str:
    run = row.run
    if run is None:
        return ""
    if run.notebook is not None:
        return _link(paths.link(run.notebook), "notebook")
    return _link(paths.link(run.path), "published" if run.published else "run folder")


def _verdict_rows(table: pd.DataFrame, paths: Paths) -> str:
    lines = []
    first = ~table.duplicated(["id", "version"])
    for r, top in zip(table.itertuples(), first, strict=True):
        if r.verdict == NOT_MEASURED and not top:
            continue
        css = " ".join(
            c for c in ("later" if not top else "", "superseded" if r.status != "current" else "") if c
        )
        claim = f"{_e(claim_text(r))}<span class='rule'>{_e(r.rule)}</span>" if top else ""
        overall = ""
        if top:
            verdict = r.overall if r.status == "current" else "superseded"
            overall = (
                f"{_badge(verdict)} <span class='why'>{_e(overall_text(r).removeprefix(verdict))}</span>"
            )
        lines.append(
            f"<tr class='{css}'>"
            f"<td class='claim'>{claim}</td>"
            f"<td class='num'>{_e(paper_text(r.paper_value, r.paper_low, r.paper_high, r.unit)) if top else ''}</td>"
            f"<td class='short'>{_e(r.preset)}</td><td class='num'>{_e(ours_text(r))}</td>"
            f"<td class='short'>{_e(seeds_text(r))}</td>"
            f"<td class='why'>{_badge(r.verdict)} <span class='why'>{_e(r.reason)}"
            f"{'; ' + _e(r.setting) if isinstance(r.setting, str) and r.setting else ''}</span></td>"
            f"<td class='why'>{overall}</td>"
            f"<td class='short'>{_evidence_link(r, paths)}</td>"
            "</tr>"
        )
    head = (
        "<tr><th>Claim and rule</th><th>Paper</th><th>Preset</th><th>Ours [95% interval]</th><th>Seeds</th>"
    )
    head += "<th>On this preset</th><th>Claim's verdict</th><th>Evidence</th></tr>"
    return f"<table class='verdicts'><thead>{head}</thead><tbody>{''.join(lines)}</tbody></table>"


def _unmeasured(table: pd.DataFrame) -> str:
    claims = table[table["status"] == "current"].drop_duplicates("id")
    missing = claims[claims["overall"] == NOT_MEASURED]
    if missing.empty:
        return ""
    items = "; ".join(f"{_e(r.family)}: {_e(r.claim)} ({_e(r.overall_reason)})" for r in missing.itertuples())
    return f"<p class='why'>{_badge(NOT_MEASURED)} {items}</p>"


def _plain_table(frame: pd.DataFrame, css: str = "") -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in frame.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(v)}</td>" for v in row) + "</tr>" for row in frame.itertuples(index=False)
    )
    return f"<table class='{css}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _runs_html(runs: pd.DataFrame) -> str:
    head = "<tr><th>Experiment</th><th>Preset</th><th>Status</th><th>Seeds</th><th>Training time</th>"
    head += "<th>Error</th><th>Folder</th></tr>"
    body = "".join(
        "<tr>"
        f"<td>{_e(r.experiment)}</td><td>{_e(r.preset)}</td><td>{_e(r.status)}</td><td>{_e(r.seeds)}</td>"
        f"<td class='num'>{_e(duration(r.train_seconds))}</td><td>{_e(r.error)}</td>"
        f"<td>{_link(r.link, r.folder)}</td>"
        "</tr>"
        for r in runs.itertuples()
    )
    return f"<table class='runs'><thead>{head}</thead><tbody>{body}</tbody></table>"


def _figures_html(table: pd.DataFrame) -> str:
    parts, include = [], "inline"  # plotly.js once, with the first figure
    for family, fig in family_figures(table):
        div = fig.to_html(
            full_html=False,
            include_plotlyjs=include,
            default_width="100%",
            config={"responsive": True, "displaylogo": False},
        )
        parts.append(f"<div class='figure' data-family='{_e(family)}'>{div}</div>")
        include = False
    return "".join(parts)


def render_page(
    table: pd.DataFrame, runs: pd.DataFrame, used: pd.DataFrame, later: pd.DataFrame, paths: Paths
) -> str:
    """Return the report as one self-contained HTML page (plotly.js inline once, links relative)."""
    measured = counts(table)["measured"]
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>rlq reproduction report</title><style>{CSS}</style></head><body><main>",
        "<h1>rlq reproduction report: which of the papers' claims hold</h1>",
        f"<p class='meta' id='summary'>{_e(summary_line(table, runs))}</p>",
        _counts_html(table),
        _verdict_rows(table, paths) if measured else "<p>No claim measured yet: run `rlq reproduce`.</p>",
        _unmeasured(table),
        "<h2>By claim family: paper (band or line) against ours (point with its 95% interval)</h2>",
        _figures_html(table),
        f"<details><summary>What the papers used ({len(used)} settings and numbers no claim tests)</summary>",
        _plain_table(used, "paper-used"),
        "</details>",
        f"<details><summary>What later work reports ({len(later)} numbers)</summary>",
        _plain_table(later, "later-work"),
        "</details>",
        f"<h2>Runs ({len(runs)})</h2>",
        "<p class='why'>Training time is that of the attempts that trained; a re-analysed run keeps it.</p>",
        _runs_html(runs),
        "</main></body></html>",
    ]
    return "\n".join(parts)
