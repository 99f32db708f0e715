"""The sparsity tuner in real JupyterLab, used as a person uses it, through headless Chromium (Playwright).

Run all, change the method and a slider, train and cancel, save and reload the page: the figures must still
hold every point, the "current" star must sit at the return the status line states, the controls must show
the starred setting after Run All's sweep, and the status line must fit its column. The notebook runs at its
committed (quick) parameters, so the test also checks that compression moves the quick agent's return.
JupyterLab starts with the settings overrides ``make venv`` installs (no news prompt over the figures).
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

from rlq.faces.widgets import STATUS_CLASS, TunerSettings

pytestmark = pytest.mark.slow  # a JupyterLab server and headless Chromium

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "sparsity_tuner.ipynb"
LAB_OVERRIDES = REPO / "tools" / "jupyterlab" / "overrides.json"
"""JupyterLab's settings overrides, which ``make venv`` copies to ``<venv>/share/jupyter/lab/settings``."""
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

#: the reward figure's plotly.js state, read from the page: every explored trace's points (the star is the
#: trace named "current", drawn last) and how many markers are drawn
_REWARD = """() => {
  const gd = [...document.querySelectorAll('.js-plotly-plot')]
    .find(g => g.layout && g.layout.title && String(g.layout.title.text).startsWith('Return vs bits'));
  if (!gd) return null;
  const explored = gd.data.filter(t => t.name !== 'current');
  const star = gd.data.find(t => t.name === 'current');
  const groups = [...gd.querySelectorAll('.scatterlayer .trace')].slice(0, explored.length);
  return {x: explored.flatMap(t => Array.from(t.x)), y: explored.flatMap(t => Array.from(t.y)),
          names: explored.map(t => t.name), colours: explored.map(t => t.marker.color),
          symbols: explored.map(t => t.marker.symbol), star: Array.from(star.y),
          star_label: star.customdata && star.customdata.length ? star.customdata[0][0] : null,
          xtype: gd.layout.xaxis.type, points: groups.reduce((n, g) => n + g.querySelectorAll('.points path').length, 0)};
}"""
#: the controls' values as the page shows them
_CONTROLS = """() => {
  const find = (selector, text) => [...document.querySelectorAll(selector)].find(e => e.textContent.includes(text));
  const choice = text => { const s = find('.widget-dropdown', text).querySelector('select');
                           return s.options[s.selectedIndex].textContent; };
  const readout = text => find('.widget-slider', text).querySelector('.widget-readout').textContent.trim();
  return {method: choice('method'), block_size: choice('block size B'), bits: choice('bits'),
          sparsity: readout('sparsity'), s_shift: readout('S_shift'),
          skip_first_last: document.querySelector('.widget-checkbox input').checked};
}"""
#: the status line's text and sizes (its widget and the HTML inside it), and the train button's top
_STATUS_BOX = f"""() => {{
  const el = document.querySelector('.{STATUS_CLASS}');
  const inner = el.querySelector('.widget-html-content') || el;
  const button = [...document.querySelectorAll('button')].find(b => b.textContent.includes('train with these'));
  return {{text: el.innerText, boxes: [el, inner].map(e => [e.scrollWidth, e.clientWidth, e.scrollHeight, e.clientHeight]),
          bottom: el.getBoundingClientRect().bottom, button_top: button.getBoundingClientRect().top}};
}}"""
_STATUS = re.compile(r"return (-?\d+(?:\.\d+)?)")


def _start_lab(root: Path, runs: Path, notebook: str = "tuner.ipynb") -> tuple[subprocess.Popen, str]:
    port, token = _free_port(), secrets.token_hex(16)
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", f"--port={port}"]
    command += [
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.root_dir={root}",
        f"--IdentityProvider.token={token}",
    ]
    # a fresh configuration folder (first-start user settings) holding the overrides make venv installs
    labconfig = root.parent / "jupyter_config" / "labconfig"
    labconfig.mkdir(parents=True)
    shutil.copy(LAB_OVERRIDES, labconfig / "default_setting_overrides.json")
    server = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RLQ_RUNS": str(runs), "JUPYTER_CONFIG_DIR": str(labconfig.parent)},
    )
    _wait_for_server(f"http://127.0.0.1:{port}/api/status?token={token}")
    return server, f"http://127.0.0.1:{port}/lab/tree/{notebook}?token={token}"


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


def _status_when(page, text: str, timeout_s: float = 120) -> dict:
    """Return the status line's box once its text holds ``text``."""
    deadline = time.monotonic() + timeout_s
    while True:
        box = page.evaluate(_STATUS_BOX)
        if text in box["text"] or time.monotonic() > deadline:
            return box
        time.sleep(0.2)


def _train_and_cancel(page, seen: dict) -> None:
    """Press "train with these settings", then cancel; record the buttons and the status line at each step."""
    train = page.get_by_role("button", name="train with these settings")
    cancel = page.get_by_role("button", name="cancel", exact=True)
    train.click()
    seen["training"] = _status_when(page, "Folder:")
    seen["training_buttons"] = (train.is_disabled(), cancel.is_disabled())
    cancel.click()
    seen["cancelled"] = _status_when(page, "training cancelled")
    page.wait_for_function(
        "() => ![...document.querySelectorAll('button')].find(b => b.textContent.includes('train with these')).disabled",
        timeout=60_000,
    )
    seen["cancelled_buttons"] = (train.is_disabled(), cancel.is_disabled())


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
    seen["run_all_controls"] = page.evaluate(_CONTROLS)
    seen["run_all_status"] = page.evaluate(_STATUS_BOX)
    seen["news"] = page.locator(".Toastify__toast", has_text=re.compile("news", re.IGNORECASE)).count()
    page.locator(".widget-dropdown", has_text="method").locator("select").select_option("gst")
    seen["method"] = _reward(page, 6)
    seen["method_status"] = _status_return(page, seen["method"]["star"][0])
    seen["method"] = page.evaluate(_REWARD)
    handle = page.locator(".widget-slider", has_text="sparsity").locator(".noUi-handle")
    handle.focus()
    page.keyboard.press("ArrowLeft")  # sparsity 0.95 (the sweep's last) -> 0.90 under GST: a new point
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
    _train_and_cancel(page, seen)  # the status line names the training from here on, not the star's point
    page.screenshot(path=str(shots / "after_reload.png"), full_page=True)
    seen["errors"] = page.locator("[data-mime-type='application/vnd.jupyter.error']").count()
    return seen


def _fits(box: dict) -> bool:
    """Whether the status line shows all its text: nothing scrolls out of it, and it ends above the button."""
    return (
        all(sw <= cw and sh <= ch for sw, cw, sh, ch in box["boxes"])
        and box["bottom"] <= box["button_top"] + 1
    )


def _in_lab(tmp_path: Path, notebook: Path, name: str, use) -> dict:
    """Open a copy of ``notebook`` named ``name`` in JupyterLab (run folders under ``tmp_path/runs``) in
    headless Chromium; return what ``use(page, url, tmp_path)`` saw there."""
    _needs_browser()
    from playwright.sync_api import sync_playwright

    root = tmp_path / "lab"
    root.mkdir()
    nb = pm.iorw.load_notebook_node(str(notebook))  # the committed parameters: the quick preset's
    (root / name).write_text(json.dumps(nb))
    server, url = _start_lab(root, tmp_path / "runs", name)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            try:
                return use(page, url, tmp_path)
            finally:
                page.screenshot(path=str(tmp_path / "last.png"), full_page=True)
                browser.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


def test_the_tuner_keeps_its_points_across_a_reload_in_jupyterlab(tmp_path):
    seen = _in_lab(tmp_path, NOTEBOOK, "tuner.ipynb", _use_the_tuner)
    run_all, method, slider, reload = seen["run_all"], seen["method"], seen["slider"], seen["reload"]
    assert run_all["xtype"] == "log" and len(run_all["y"]) == 5
    assert max(run_all["y"]) - min(run_all["y"]) > MIN_RETURN_SPREAD, run_all["y"]
    assert len(set(run_all["x"])) == 5  # bits per weight tell every explored point apart
    assert len(method["y"]) == 6 and len(slider["y"]) == 7
    # one colour per method, and the legend names each method and precision once
    assert sorted(slider["names"]) == ["gst, 32 bit", "none, 32 bit", "pruning, 32 bit"]
    assert len(set(slider["colours"])) == 3
    # after Run All the controls show the setting the star marks (the sweep's last), as the status names it
    shown = seen["run_all_controls"]
    controls = TunerSettings(
        method=shown["method"], block_size=int(shown["block_size"]), sparsity=float(shown["sparsity"]),
        s_shift=float(shown["s_shift"]), skip_first_last=shown["skip_first_last"], bits=int(shown["bits"]),
    )  # fmt: skip
    assert controls.label() == run_all["star_label"] == "pruning s=0.95, 32 bit"
    assert seen["run_all_status"]["text"].startswith(run_all["star_label"])
    # the star is at the return the status line states (to its one decimal)
    for figure, status in ((method, "method_status"), (slider, "slider_status"), (reload, "reload_status")):
        assert figure["star"][0] == pytest.approx(seen[status], abs=0.051)
    assert slider["star_label"] == "gst B=4 s=0.90, 32 bit"
    # training: the train button waits, cancel stops it; the status with its folder fits its column
    assert seen["training_buttons"] == (True, False) and seen["cancelled_buttons"] == (False, True)
    # the folder relative to the notebook's folder (tmp/lab), not the absolute path
    assert (
        "Folder: ../runs/interactive/" in seen["cancelled"]["text"]
        and str(tmp_path) not in seen["cancelled"]["text"]
    )
    for box in ("run_all_status", "training", "cancelled"):
        assert _fits(seen[box]), (box, seen[box])
    assert reload["x"] == slider["x"] and reload["y"] == slider["y"]  # every point survives the reload
    assert seen["errors"] == 0 and seen["news"] == 0


#: the code cells' prompts: the execution count each shows (None while queued or never run)
_PROMPTS = """() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => {
  const m = e.textContent.match(/\\[(\\d+)\\]/); return m ? Number(m[1]) : null; })"""


def _run_all_cells(page, timeout_ms: int) -> list[int | None]:
    """Run > Run All Cells; return the prompts once every code cell ran anew or the run stopped at an error."""
    before = max(filter(None, page.evaluate(_PROMPTS)), default=0)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    page.wait_for_function(
        f"""() => {{ const p = ({_PROMPTS})();
            return p.every(n => n !== null && n > {before})
                || document.querySelector("[data-mime-type='application/vnd.jupyter.error']") !== null; }}""",
        timeout=timeout_ms,
    )
    _idle(page, timeout_ms)
    return page.evaluate(_PROMPTS)


def _rerun_then_change(page, url: str, tmp_path: Path, change: str) -> dict:
    """Run All; Run All again, unchanged; then append ``change`` to the parameters cell and Run All. Return
    each pass's error outputs and output text, the run folders, and the times of what training and export
    wrote (saved jobs, models, exported files) after each pass."""

    def written(f: Path) -> bool:
        return "jobs" in f.parts or f.suffix in (".zip", ".c", ".h", ".onnx", ".pt")

    seen = {}
    page.goto(url)
    page.wait_for_selector(".jp-Notebook", timeout=90_000)
    _idle(page)
    runs = tmp_path / "runs"
    wait = int(os.environ.get("RLQ_BROWSER_WAIT_MS", 600_000))
    for step in ("first", "again", "changed"):
        if step == "changed":
            page.locator(".jp-CodeCell .cm-content").first.click()
            page.keyboard.press("Control+End")
            page.keyboard.press("Enter")
            page.keyboard.insert_text(change)
        _run_all_cells(page, wait)
        seen[step] = {
            "errors": page.locator("[data-mime-type='application/vnd.jupyter.error']").all_inner_texts(),
            "text": "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts()),
            "folders": sorted(p.name for p in (runs / "interactive").iterdir()),
            "mtimes": {str(f): f.stat().st_mtime_ns for f in runs.rglob("*") if f.is_file() and written(f)},
        }
    return seen


@pytest.mark.parametrize(
    ("notebook", "change", "changed"),
    [("deploy_policy", "block_size = 8", "B=8"), ("gst_td3_mujoco", "s_shift = 0.5", None)],
)
def test_a_rerun_reuses_and_a_changed_knob_trains_anew_in_the_same_kernel(
    tmp_path, notebook, change, changed
):
    """Run All twice with nothing changed: no error, one run folder, nothing trained or exported again. Then a
    knob changed in the parameters cell and Run All: a second run folder, trained with the new value."""
    seen = _in_lab(tmp_path, REPO / "notebooks" / f"{notebook}.ipynb", f"{notebook}.ipynb",
                   lambda page, url, tmp: _rerun_then_change(page, url, tmp, change))  # fmt: skip
    first, again, after = seen["first"], seen["again"], seen["changed"]
    assert not first["errors"] + again["errors"] + after["errors"], [
        first["errors"],
        again["errors"],
        after["errors"],
    ]
    assert len(first["folders"]) == 1 and again["folders"] == first["folders"]
    assert again["mtimes"] == first["mtimes"] and first["mtimes"], "a rerun with nothing changed wrote again"
    assert len(after["folders"]) == 2 and after["folders"][0] == first["folders"][0]
    new = tmp_path / "runs" / "interactive" / after["folders"][1]
    key, value = (s.strip() for s in change.split("="))
    assert json.loads((new / "params.json").read_text())[key] == json.loads(value)
    assert min(f.stat().st_mtime_ns for f in new.rglob("*") if f.is_file()) > max(first["mtimes"].values())
    assert changed is None or any(changed in f.read_text() for f in new.rglob("*.h"))  # the new B exported
    for shown in (first, again, after):  # no machine path in what the notebook prints
        assert str(tmp_path) not in shown["text"] and sys.prefix not in shown["text"]
