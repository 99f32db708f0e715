"""The reproduction report in headless Chromium at 1280x800: verdicts on the first screen, every figure drawn."""

from __future__ import annotations

import pytest
from test_browser import CHROMIUM, CHROMIUM_ARGS, _needs_browser
from test_report import ABSOLUTE_PATH, synthetic_runs

from rlq.faces.report import build_report, claims_table, collect_runs
from rlq.faces.report_figures import plotted_rows

pytestmark = pytest.mark.slow  # headless Chromium

WIDTH, HEIGHT = 1280, 800


def test_report_reads_verdict_first_in_a_browser(tmp_path):
    _needs_browser()
    from playwright.sync_api import sync_playwright

    runs = synthetic_runs(tmp_path / "runs")
    out, _ = build_report(runs, tmp_path / "report.html", tmp_path / "no_results")
    table = claims_table(collect_runs(runs, tmp_path / "no_results"))
    families = plotted_rows(table)["family"].nunique()  # the families with a number to draw
    assert families >= 2
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            page.goto(out.resolve().as_uri())
            page.wait_for_function(
                f"() => document.querySelectorAll('.plotly .main-svg').length >= {families}", timeout=20_000
            )
            plots = page.locator(".plotly").count()
            drawn = page.evaluate(
                "() => [...document.querySelectorAll('.js-plotly-plot')].map(g => g.querySelectorAll('.shapelayer path').length)"
            )
            counts = page.locator("#verdict-counts").bounding_box()
            first_row = page.locator("table.verdicts tbody tr").first.bounding_box()
            widths = page.evaluate(
                "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
            )
            html = page.content()
            page.screenshot(path=str(tmp_path / "report.png"))
        finally:
            browser.close()
    assert plots == families  # one forest plot per claim family with a measured number
    assert len(drawn) == families and all(n >= 1 for n in drawn)  # each draws the papers' values or ranges
    assert counts["y"] + counts["height"] <= HEIGHT and first_row["y"] + first_row["height"] <= HEIGHT
    assert widths[0] <= widths[1]  # no horizontal scroll at 1280 px
    assert str(tmp_path) not in html and not ABSOLUTE_PATH.search(html)
