"""The sparsity tuner in real JupyterLab, used as a person uses it, through headless Chromium (Playwright).

Run all, change the method and a slider, save and reload the page: the figures must still hold every point,
and the "current" star must sit at the return the status line states. The notebook runs at its committed
(quick) parameters, so the test also checks that compression moves the quick agent's return.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import papermill as pm
import pytest

from rlq.faces.widgets import STATUS_CLASS

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "sparsity_tuner.ipynb"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def _needs_browser():
    """Skip where Chromium or Playwright is missing, except in CI, where .ci/run installs both."""
    missing = [] if Path(CHROMIUM).exists() else ["chromium"]
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("playwright")
    if missing and os.environ.get("CI") != "true":
        pytest.skip(f"not installed: {', '.join(missing)} (.ci/run installs them)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_server(url: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"JupyterLab did not answer at {url}")


#: the least spread (max - min) of the returns the quick notebook explores: its SAC Pendulum agent scores
#: about -100 dense and below -800 at 95% sparsity, where a task without a trade-off scores one value
MIN_RETURN_SPREAD = 200.0

#: the reward figure's plotly.js state, read from the page
_REWARD = """() => {
  const gd = [...document.querySelectorAll('.js-plotly-plot')]
    .find(g => g.layout && g.layout.title && String(g.layout.title.text).startsWith('Return vs bits'));
  if (!gd) return null;
  return {x: Array.from(gd.data[0].x), y: Array.from(gd.data[0].y), star: Array.from(gd.data[1].y),
          xtype: gd.layout.xaxis.type, points: gd.querySelectorAll('.scatterlayer .trace:first-child .points path').length};
}"""
_STATUS = re.compile(r"return (-?\d+(?:\.\d+)?)")


def _start_lab(root: Path, runs: Path) -> tuple[subprocess.Popen, str]:
    port, token = _free_port(), secrets.token_hex(16)
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", f"--port={port}"]
    command += [
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.root_dir={root}",
        f"--IdentityProvider.token={token}",
    ]
    server = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RLQ_RUNS": str(runs)},
    )
    _wait_for_server(f"http://127.0.0.1:{port}/api/status?token={token}")
    return server, f"http://127.0.0.1:{port}/lab/tree/tuner.ipynb?token={token}"


def _reward(page, at_least: int, timeout_ms: int = 180_000) -> dict:
    """Return the reward figure's state once it shows at least ``at_least`` points (scrolled into view)."""
    page.locator(".widget-slider", has_text="sparsity").first.scroll_into_view_if_needed(timeout=timeout_ms)
    page.wait_for_function(
        f"() => {{ const r = ({_REWARD})(); return r !== null && r.points >= {at_least}; }}",
        timeout=timeout_ms,
    )
    return page.evaluate(_REWARD)


def _status_return(page, star: float, timeout_s: float = 15) -> float:
    """Return the status line's return once it is ``star``'s (the two are set one after the other), else the last."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = page.locator(f".{STATUS_CLASS}").first.inner_text()
        found = _STATUS.search(text)
        if found and abs(float(found.group(1)) - star) < 0.051 or time.monotonic() > deadline:
            break
        time.sleep(0.25)
        star = page.evaluate(_REWARD)["star"][0]
    assert found, f"the status line names no return: {text!r}"
    return float(found.group(1))


def _idle(page, timeout_ms: int = 180_000) -> None:
    page.locator(".jp-StatusBar-Widget", has_text="Idle").first.wait_for(timeout=timeout_ms)


def _use_the_tuner(page, url: str, shots: Path) -> dict:
    """Do what a person does; return what the page showed at each step."""
    seen = {}
    page.goto(url)
    page.wait_for_selector(".jp-Notebook", timeout=90_000)
    _idle(page)  # the kernel is connected
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    wait = int(os.environ.get("RLQ_BROWSER_WAIT_MS", 300_000))
    # dense, the first setting (pruning 0.5) and the sweep's 0.8, 0.9 and 0.95 (its 0.5 is the first setting)
    seen["run_all"] = _reward(page, 5, wait)
    # the sweep's table is the last output but the headline numbers': run all is then nearly done
    page.wait_for_selector("[data-mime-type='text/html'] table", timeout=wait)
    _idle(page, wait)
    seen["run_all"] = page.evaluate(_REWARD)
    page.locator(".widget-dropdown", has_text="method").locator("select").select_option("gst")
    seen["method"] = _reward(page, 6)
    seen["method_status"] = _status_return(page, seen["method"]["star"][0])
    seen["method"] = page.evaluate(_REWARD)
    handle = page.locator(".widget-slider", has_text="sparsity").locator(".noUi-handle")
    handle.focus()
    page.keyboard.press("ArrowRight")  # sparsity 0.5 -> 0.55 under GST: a new point
    seen["slider"] = _reward(page, 7)
    seen["slider_status"] = _status_return(page, seen["slider"]["star"][0])
    seen["slider"] = page.evaluate(_REWARD)
    page.screenshot(path=str(shots / "before_reload.png"), full_page=True)
    page.locator(".jp-Notebook").first.click(position={"x": 5, "y": 5})
    page.keyboard.press("Control+s")  # JupyterLab keeps widget views in the saved notebook
    page.locator(".jp-mod-dirty").first.wait_for(state="detached", timeout=30_000)
    page.reload()
    page.wait_for_selector(".jp-Notebook", timeout=90_000)
    _idle(page)
    seen["reload"] = _reward(page, 7)
    seen["reload_status"] = _status_return(page, seen["reload"]["star"][0])
    seen["reload"] = page.evaluate(_REWARD)
    page.screenshot(path=str(shots / "after_reload.png"), full_page=True)
    seen["errors"] = page.locator("[data-mime-type='application/vnd.jupyter.error']").count()
    return seen


def test_the_tuner_keeps_its_points_across_a_reload_in_jupyterlab(tmp_path):
    _needs_browser()
    from playwright.sync_api import sync_playwright

    root = tmp_path / "lab"
    root.mkdir()
    nb = pm.iorw.load_notebook_node(str(NOTEBOOK))  # the committed parameters: the quick preset's
    (root / "tuner.ipynb").write_text(json.dumps(nb))
    server, url = _start_lab(root, tmp_path / "runs")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            try:
                seen = _use_the_tuner(page, url, tmp_path)
            finally:
                page.screenshot(path=str(tmp_path / "last.png"), full_page=True)
                browser.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
    run_all, method, slider, reload = seen["run_all"], seen["method"], seen["slider"], seen["reload"]
    assert run_all["xtype"] == "log" and len(run_all["y"]) == 5
    assert max(run_all["y"]) - min(run_all["y"]) > MIN_RETURN_SPREAD, run_all["y"]
    assert len(set(run_all["x"])) == 5  # bits per weight tell every explored point apart
    assert len(method["y"]) == 6 and len(slider["y"]) == 7
    # the star is at the return the status line states (to its one decimal)
    for figure, status in ((method, "method_status"), (slider, "slider_status"), (reload, "reload_status")):
        assert figure["star"][0] == pytest.approx(seen[status], abs=0.051)
    assert reload["x"] == slider["x"] and reload["y"] == slider["y"]  # every point survives the reload
    assert seen["errors"] == 0
