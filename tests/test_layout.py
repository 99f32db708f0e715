"""Layout rules a reader relies on: small modules and functions, and notebooks that define no code of their own."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def modules() -> list[Path]:
    return sorted((ROOT / "rlq").rglob("*.py"))


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_stay_small(path):
    source = path.read_text()
    lines = source.count("\n")
    assert lines <= MAX_MODULE_LINES, (
        f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_MODULE_LINES})"
    )
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.relative_to(ROOT)}: functions over {MAX_FUNCTION_LINES} lines: {long}"


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebooks_define_no_function_or_class(path):
    cells = json.loads(path.read_text())["cells"]
    defined = [
        match.group(0).strip()
        for cell in cells
        if cell["cell_type"] == "code"
        for match in re.finditer(r"^\s*(?:async\s+)?(?:def|class)\s+\w+", "".join(cell["source"]), re.M)
    ]
    assert not defined, f"{path.name} defines {defined} in a cell: move shared code into rlq, or inline it"


def test_the_rules_catch_what_they_are_for(tmp_path):
    """The checks above can fail: a long function and a notebook def are found by the same scans."""
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES))
    tree = ast.parse(f"def long():\n{body}\n")
    (node,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    assert re.search(r"^\s*(?:async\s+)?(?:def|class)\s+\w+", "x = 1\n    def helper(t):\n", re.M)
