"""The sparsity tuner in real JupyterLab, driven through headless Chromium (Debian's, through Playwright)."""

from __future__ import annotations

import os
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


def test_tuner_slider_updates_the_figure_in_jupyterlab(tmp_path):
    _needs_browser()
    from playwright.sync_api import sync_playwright

    root = tmp_path / "lab"
    root.mkdir()
    # the committed notebook with a smaller agent and no automatic sweep, so the slider is what adds points
    nb = pm.parameterize.parameterize_notebook(
        pm.iorw.load_notebook_node(str(NOTEBOOK)),
        {"train_timesteps": 2048, "eval_episodes": 1, "sweep_sparsities": [], "torch_threads": 1},
    )
    import nbformat

    nbformat.write(nb, root / "tuner.ipynb")
    port, token = _free_port(), secrets.token_hex(16)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--allow-root",
            f"--port={port}",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.root_dir={root}",
            f"--IdentityProvider.token={token}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RLQ_RUNS": str(tmp_path / "runs")},
    )
    try:
        _wait_for_server(f"http://127.0.0.1:{port}/api/status?token={token}")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"http://127.0.0.1:{port}/lab/tree/tuner.ipynb?token={token}")
                page.wait_for_selector(".jp-Notebook", timeout=90_000)
                # the kernel must be connected before cells are run: the status bar says so
                page.locator(".jp-StatusBar-Widget", has_text="Idle").first.wait_for(timeout=90_000)
                page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
                page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
                handle = page.locator(".widget-slider", has_text="sparsity").locator(".noUi-handle")
                handle.wait_for(timeout=int(os.environ.get("RLQ_BROWSER_WAIT_MS", 180_000)))
                points = page.locator(".js-plotly-plot .scatterlayer .trace").first.locator(".points path")
                page.wait_for_function(
                    "() => document.querySelectorAll('.js-plotly-plot .scatterlayer .trace:first-child .points path')"
                    ".length >= 2",
                    timeout=120_000,
                )
                before = points.count()
                handle.focus()
                page.keyboard.press("ArrowRight")
                page.wait_for_function(
                    f"() => document.querySelectorAll('.js-plotly-plot .scatterlayer .trace:first-child .points path')"
                    f".length > {before}",
                    timeout=120_000,
                )
                after = points.count()
                page.screenshot(path=str(tmp_path / "tuner.png"), full_page=True)
                errors = page.locator("[data-mime-type='application/vnd.jupyter.error']").count()
                status = page.locator(".widget-label", has_text="return").count()
            finally:
                page.screenshot(
                    path=str(tmp_path / "last.png"), full_page=True
                )  # what the page showed at the end
                browser.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
    assert after == before + 1
    assert errors == 0
    assert status >= 1
    assert (tmp_path / "tuner.png").stat().st_size > 10_000
