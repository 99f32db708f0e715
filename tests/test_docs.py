"""The README's quickstart runs as printed, every relative link and image in the docs resolves, and the product's
prose (pages, notebook markdown, docstrings) states what is true now."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def history_in(text: str) -> str | None:
    """Return the first phrase of ``text`` that narrates history or speaks in the first person, else None."""
    found = FIRST_PERSON.search(text) or HISTORY.search(TECHNICAL_SESSION.sub("", text))
    return found.group(0) if found else None


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
