"""The README's quickstart runs as printed, every relative link and image in the docs resolves, the product's
prose (pages, notebook markdown, docstrings) states what is true now, and each preset's wall time is stated once,
in its notebook's ``PRESET_WALL_TIMES``: README's experiments table is generated from there and no other page or
notebook markdown restates one."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlq.experiments.registry import Experiment, list_experiments

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FIRST_PERSON = re.compile(r"\bI (did|found|ran|measured|checked|tried|could|have|left)\b")
HISTORY = re.compile(r"\b[Ii]ssue \d+\b|\bsessions?\b|\b(earlier|older) rlq\b|\bsince-mended\b", re.I)
"""What tells the project's history instead of the code's present: an issue's number, a work session, an older
rlq, a since-mended rule."""
TECHNICAL_SESSION = re.compile(
    r"\b(ONNX Runtime|ONNX|inference|browser|JupyterLab|kernel|HTTP) sessions?\b", re.I
)
"""Sessions that are things the code opens (ONNX Runtime's, a browser's), not work sessions."""
DURATION = (
    r"\d+(?:[.,]\d+)?(?:\s*(?:-|to)\s*\d+(?:[.,]\d+)?)?\s*(?:s|sec|seconds?|min|minutes?|h|hours?|days?)\b"
)
"""A stated duration: ``30 s``, ``about 17 min``'s number and unit, ``110-130 h``, ``2.5 days``."""
TABLE_SEPARATOR = re.compile(r"\s*\|[\s:|-]+\|\s*$")
_spec = importlib.util.spec_from_file_location("readme_experiments", ROOT / "tools" / "readme_experiments.py")
readme_experiments = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_experiments)


def history_in(text: str) -> str | None:
    """Return the first phrase of ``text`` that narrates history or speaks in the first person, else None."""
    found = FIRST_PERSON.search(text) or HISTORY.search(TECHNICAL_SESSION.sub("", text))
    return found.group(0) if found else None


def stated_wall_times(text: str, presets: set[str]) -> list[str]:
    """Return each place in the Markdown ``text`` that states a wall time of one of ``presets``.

    A place is a table with a wall-time column or a column named after a preset, a table row of a preset that
    holds a duration, or prose that gives a preset a duration (`` `quick` (about 30 s)``, ``the `medium` preset
    takes about 20 min``, ``preset `paper` in 3 h``). A command (``--preset medium ... in 113 min``) and a run's own
    measured time (``a full `medium` run (3 seeds; 42 min)``) are not a preset's wall time.
    """
    names = "|".join(map(re.escape, sorted(presets, key=len, reverse=True)))
    mention = rf"(?:`(?:{names})`(?:\s+preset)?|\b(?:{names})\s+preset\b|(?<!-)\bpreset\s+`?(?:{names})\b`?)"
    prose = re.compile(
        rf"{mention}(?:\s*\([^()]*?{DURATION}[^()]*\)"
        rf"|[^.;:\n()`]{{0,60}}?\b(?:about|in|takes|is)\s+(?:about\s+)?{DURATION})",
        re.I,
    )
    lines = text.splitlines()
    found = []
    for line, after in zip(lines, [*lines[1:], ""], strict=True):
        if not line.lstrip().startswith("|"):
            continue
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        header = bool(TABLE_SEPARATOR.match(after))
        if header and (re.search(r"wall[ -]?times?|time on \d+ CPU", line, re.I) or presets & set(cells)):
            found.append(line)
        elif cells[0] in presets and re.search(DURATION, line):
            found.append(line)
    flowing = " ".join(line.strip() for line in lines if not line.lstrip().startswith("|"))
    return found + [m.group(0) for m in prose.finditer(flowing)]


def docstrings(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line, docstring)`` of the module, every class and function, and every documented attribute."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc
        body = node.body if isinstance(getattr(node, "body", None), list) else []
        for before, after in zip(body[:-1], body[1:], strict=True):
            if isinstance(before, (ast.Assign, ast.AnnAssign)) and isinstance(after, ast.Expr):
                if isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                    yield after.lineno, after.value.value


@pytest.mark.slow
def test_the_readme_quickstart_runs(tmp_path):
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "README.md has no python block"
    code = blocks[0]
    assert 10 <= code.count("\n") <= 25, "the quickstart should stay a 10-20 line block"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "average compression over training" in result.stdout


def test_the_readme_stays_short():
    assert (ROOT / "README.md").read_text().count("\n") <= 150


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(page):
    text = page.read_text()
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # web links and in-page anchors
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_state_what_is_true_not_what_a_session_did(page):
    found = history_in(page.read_text())
    assert not found, f"{page.relative_to(ROOT)} says {found!r}"


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebooks_markdown_states_what_is_true_not_what_a_session_did(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    found = history_in(text)
    assert not found, f"{notebook.name} says {found!r}"


def test_docstrings_state_what_is_true_not_what_a_session_did():
    flagged = [
        f"{path.relative_to(ROOT)}:{line}: {found!r}"
        for path in sorted((ROOT / "rlq").rglob("*.py"))
        for line, doc in docstrings(path)
        if (found := history_in(doc))
    ]
    assert not flagged, "docstrings that narrate history:\n" + "\n".join(flagged)


def test_the_prose_check_flags_issues_sessions_and_older_versions_but_not_onnx_sessions(tmp_path):
    assert history_in("Mended in issue 14 of this project.") == "issue 14"
    assert history_in("It learns too slowly to converge within a session.") == "session"
    assert history_in("the rule of earlier rlq versions") == "earlier rlq"
    assert history_in("I measured 3 s.") == "I measured"
    assert history_in("an ONNX Runtime session and one browser session per figure") is None
    assert history_in("Yield the ray module: ``with ray_session():`` shares one instance.") is None
    module = tmp_path / "made_up.py"
    module.write_text(
        '"""A module."""\n\nLIMIT = 3\n"""At most three (issue 2)."""\n\n\nclass Thing:\n'
        '    """What this session built."""\n\n    def go(self) -> None:\n        """Go (issue 5)."""\n'
    )
    found = sorted((line, history_in(doc)) for line, doc in docstrings(module))
    assert found == [(1, None), (4, "issue 2"), (8, "session"), (11, "issue 5")]


def test_the_readme_experiments_table_is_what_the_registry_says():
    readme = (ROOT / "README.md").read_text()
    assert readme_experiments.render(readme) == readme, (
        "README.md's experiments table is out of date: run python tools/readme_experiments.py"
    )
    assert readme_experiments.main(["--check"]) == 0
    quick = {exp.name: exp.wall_times["quick"] for exp in list_experiments()}
    for name, wall_time in quick.items():
        assert f"| `{name}` | " in readme and f" | {wall_time} |" in readme


def test_the_experiments_table_check_fails_on_a_stale_or_unmarked_table(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `quarl_actorq` |"))
    stale = readme.replace(row, row.rsplit("|", 2)[0] + "| about a minute |")
    assert stale != readme and readme_experiments.render(stale) == readme
    monkeypatch.setattr(readme_experiments, "README", tmp_path / "README.md")
    (tmp_path / "README.md").write_text(stale)
    assert readme_experiments.main(["--check"]) == 1
    assert readme_experiments.main([]) == 0 and (tmp_path / "README.md").read_text() == readme
    with pytest.raises(readme_experiments.MarkersError):
        readme_experiments.splice(readme.replace(readme_experiments.END, ""), "")
    made_up = Experiment(
        "made_up", tmp_path / "made_up.ipynb", "A | B", {}, wall_times={"quick": "about 9 s"}
    )
    assert readme_experiments.table([made_up]).splitlines()[-1] == "| `made_up` | A \\| B | about 9 s |"


def all_presets() -> set[str]:
    """Return the name of every preset of every experiment notebook."""
    return {preset for exp in list_experiments() for preset in exp.presets}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_state_no_preset_wall_time_outside_the_generated_table(page):
    text = page.read_text()
    if page.name == "README.md" and page.parent == ROOT:
        text = readme_experiments.splice(text, "")
    found = stated_wall_times(text, all_presets())
    assert not found, (
        f"{page.relative_to(ROOT)} states preset wall times (PRESET_WALL_TIMES holds them): {found}"
    )


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebooks_markdown_states_no_preset_wall_time(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    text = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    found = stated_wall_times(text, all_presets())
    assert not found, f"{notebook.name} states preset wall times (PRESET_WALL_TIMES holds them): {found}"


def test_the_wall_time_check_flags_columns_rows_and_prose_but_not_commands_or_runs():
    presets = {"quick", "medium", "paper"}
    column = (
        "| preset | setting | wall time on 2 CPU cores |\n|---|---|---|\n| `quick` | 1k steps | about 30 s |"
    )
    assert stated_wall_times(column, presets) == column.splitlines()[:1] + column.splitlines()[2:]
    assert stated_wall_times("| notebook | quick |\n|---|---|\n| `x` | 20 s |", presets) == [
        "| notebook | quick |"
    ]
    assert stated_wall_times("Its `quick` preset takes about 45 s on 2 cores.", presets) == [
        "`quick` preset takes about 45 s"
    ]
    assert stated_wall_times("The `paper` preset (1M steps,\nabout 120 h) is the paper's.", presets) == [
        "`paper` preset (1M steps, about 120 h)"
    ]
    assert stated_wall_times("Run preset medium in 20 min.", presets) == ["preset medium in 20 min"]
    assert not stated_wall_times("| preset | setting |\n|---|---|\n| `quick` | 1k steps, 8 envs |", presets)
    assert not stated_wall_times("`rlq run x --preset medium` trained the 23 runs in 113 min.", presets)
    assert not stated_wall_times("A full `medium` run (3 seeds; 42 min with 2 workers), published.", presets)
    assert not stated_wall_times(
        "`quick` runs in well under a minute; `medium` takes tens of minutes.", presets
    )


def test_the_results_page_names_every_confirmatory_folder_and_no_other():
    results = ROOT / "data" / "results"
    folders = {p.parent.relative_to(results).as_posix() for p in results.glob("*/confirmatory*/results.json")}
    page = (ROOT / "docs" / "results.md").read_text()
    named = set()
    for experiment, first, more in re.findall(
        r"`(\w+)/(confirmatory\w*)`((?: and `confirmatory\w*`)*)", page
    ):
        named |= {f"{experiment}/{name}" for name in [first, *re.findall(r"`(confirmatory\w*)`", more)]}
    assert folders and named == folders
