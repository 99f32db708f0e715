"""The papers' numbers: tidy, loadable, filterable, and each one found in the paper briefs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlq.experiments.paper import COLUMNS, paper_numbers, paper_value

BRIEFS = Path(__file__).resolve().parents[2] / "shared" / "papers"


def test_paper_tables_are_tidy():
    frame = paper_numbers()
    assert list(frame.columns) == COLUMNS
    assert set(frame["paper"]) == {"gst", "quarl"}
    assert frame["value"].dtype.kind == "f" and frame["value"].notna().all()
    assert frame["metric"].str.fullmatch(r"[a-z0-9_]+").all()


def test_filters_and_single_values():
    assert paper_value("gst", "avg_compression_ratio", experiment="a2c_atari") == 71.9
    assert paper_value("quarl", "pull_seconds_int8") == 0.45
    assert len(paper_numbers("gst", experiment="imagenet")) == 3
    with pytest.raises(LookupError):
        paper_value("gst", "avg_compression_ratio")  # several experiments report it
    with pytest.raises(ValueError, match="known papers: gst, quarl"):
        paper_numbers("nosuch")
    with pytest.raises(ValueError, match="unknown column"):
        paper_numbers("gst", nosuch="x")


@pytest.mark.skipif(not BRIEFS.is_dir(), reason="the paper briefs (shared/papers) are not beside this clone")
@pytest.mark.parametrize("paper", ["gst", "quarl"])
def test_every_number_appears_in_the_paper_brief(paper):
    text = (BRIEFS / f"{paper}.md").read_text().replace(",", "")
    numbers = {float(n) for n in re.findall(r"\d+(?:\.\d+)?", text)}
    frame = paper_numbers(paper)
    # 0 ("no drop") and 1 (a yes) encode words of the brief, not printed numbers
    missing = frame[~frame["value"].isin(numbers) & ~frame["value"].isin([0.0, 1.0])]
    assert missing.empty, missing[["experiment", "metric", "value"]].to_string()
