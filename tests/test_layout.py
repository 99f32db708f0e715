"""Layout rules a reader relies on: functions within ruff's ceilings, one module per basename, and notebooks
that define no more code of their own than their per-run function and one figure."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DEF = re.compile(r"^[ \t]*(?:async\s+)?(?:def|class)\s+\w+", re.M)
MAX_NOTEBOOK_FUNCTIONS = 2
"""A notebook defines its per-run function and at most one more (a figure only it draws)."""


def ruff(*args: str) -> subprocess.CompletedProcess:
    """Run the ruff installed beside this Python with the project's config (skip where there is none)."""
    binary = Path(sys.executable).parent / "ruff"
    if not binary.exists():
        pytest.skip(f"no ruff beside {sys.executable}: install the dev extra (pip install -e '.[dev]')")
    command = [str(binary), "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True)


def test_the_package_passes_ruff_with_the_project_rules():
    result = ruff("rlq")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_reports_a_function_over_the_argument_ceiling(tmp_path):
    """The configured rule can fail: nine parameters are one over max-args, eight are within it."""
    nine, eight = tmp_path / "nine.py", tmp_path / "eight.py"
    nine.write_text("def nine(a, b, c, d, e, f, g, h, i):\n    return a\n")
    eight.write_text("def eight(a, b, c, d, e, f, g, h):\n    return a\n")
    result = ruff("--output-format", "concise", str(nine))
    assert result.returncode == 1 and "PLR0913" in result.stdout, result.stdout + result.stderr
    assert ruff(str(eight)).returncode == 0


def repeated_module_names(package: Path = ROOT / "rlq") -> dict[str, list[str]]:
    """Return each basename two or more modules under ``package`` share (``__init__.py`` and C files aside)."""
    paths: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        if path.name != "__init__.py":
            paths.setdefault(path.name, []).append(path.relative_to(package.parent).as_posix())
    return {name: where for name, where in paths.items() if len(where) > 1}


def test_no_two_modules_share_a_basename():
    """A name says which module it is: a traceback's or an editor tab's ``figures.py`` names one file."""
    repeated = repeated_module_names()
    assert not repeated, f"modules share basenames: {repeated}"


def test_the_basename_rule_catches_what_it_is_for(tmp_path):
    """The scan can fail: two ``figures.py`` in two subpackages are found; ``__init__.py`` files and C files are not."""
    for folder in ("pkg", "pkg/gst", "pkg/quarl"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
        (tmp_path / folder / "_kernels.c").write_text("")
    (tmp_path / "pkg/gst/figures.py").write_text("")
    (tmp_path / "pkg/quarl/figures.py").write_text("")
    (tmp_path / "pkg/quarl/tables.py").write_text("")
    assert repeated_module_names(tmp_path / "pkg") == {
        "figures.py": ["pkg/gst/figures.py", "pkg/quarl/figures.py"]
    }


def notebook_definitions(cells: list[dict]) -> list[str]:
    """Return the start of every ``def`` and ``class`` line of a notebook's code cells (a nested one indented)."""
    return [
        match.group(0)
        for cell in cells
        if cell["cell_type"] == "code"
        for match in NOTEBOOK_DEF.finditer("".join(cell["source"]))
    ]


def definition_problems(definitions: list[str]) -> list[str]:
    """Return what breaks the notebook rule: a class, a function nested in another, more than two functions."""
    problems = [d for d in definitions if d.startswith("class") or d[:1].isspace()]
    functions = [d for d in definitions if not d.startswith("class") and not d[:1].isspace()]
    if len(functions) > MAX_NOTEBOOK_FUNCTIONS:
        problems.append(f"{len(functions)} functions ({', '.join(functions)})")
    return problems


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebooks_define_at_most_their_per_run_function_and_one_more(path):
    problems = definition_problems(notebook_definitions(json.loads(path.read_text())["cells"]))
    assert not problems, (
        f"{path.name} defines {problems} in its cells: a notebook defines its per-run function and at most one "
        "more (a figure), each at the top level of a cell; move shared code into rlq"
    )


def test_the_notebook_rule_catches_what_it_is_for():
    """The notebook scan can fail: a class, a nested def and a third function are found, a call is not."""
    assert NOTEBOOK_DEF.search("x = 1\n    def helper(t):\n")
    assert NOTEBOOK_DEF.search("async def fetch():\n    pass\n")
    assert not NOTEBOOK_DEF.search("define(x)\nresult = classify(y)\n")
    cell = {
        "cell_type": "code",
        "source": ["def train_one(seed):\n", "    def helper(t):\n", "        return t\n"],
    }
    assert definition_problems(notebook_definitions([cell])) == ["    def helper"]
    three = {"cell_type": "code", "source": ["def a():\n    pass\ndef b():\n    pass\ndef c():\n    pass\n"]}
    assert definition_problems(notebook_definitions([three])) == ["3 functions (def a, def b, def c)"]
    assert definition_problems(
        notebook_definitions([{"cell_type": "code", "source": ["class Net:\n    pass\n"]}])
    )
    assert not definition_problems(
        notebook_definitions([{"cell_type": "code", "source": ["def train_one(seed):\n    return seed\n"]}])
    )


def rebound_parameters(cells: list[dict], parameters: set[str]) -> list[str]:
    """Return the parameters a code cell binds anew (assignment, loop, ``with ... as``, import, comprehension
    aside) after the cells that set them: the parameters cell, the presets cell and ``apply_preset``'s."""
    import ast

    found = []
    for cell in cells:
        tags = cell.get("metadata", {}).get("tags", [])
        source = "".join(cell["source"])
        if cell["cell_type"] != "code" or {"parameters", "presets"} & set(tags) or "apply_preset(" in source:
            continue
        tree = ast.parse(source)
        comprehension_names = {
            n.id for c in ast.walk(tree) if isinstance(c, ast.comprehension) for n in ast.walk(c.target)
            if isinstance(n, ast.Name)
        }  # fmt: skip
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id in parameters:
                if node.id not in comprehension_names:  # a comprehension's name is its own scope
                    found.append(f"{node.id} (line {node.lineno})")
            elif isinstance(node, ast.alias) and (node.asname or node.name) in parameters:
                found.append(f"{node.asname or node.name} (import)")
    return found


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_no_cell_rebinds_a_parameter(path):
    """A parameter rebound in a later cell (``for preset in ...``) reads, in JupyterLab, as a knob the user
    changed: the next ``run_dir()`` starts a new run folder and the results land apart from their runs."""
    from rlq.experiments.registry import load_experiment

    experiment = load_experiment(path)
    found = rebound_parameters(json.loads(path.read_text())["cells"], set(experiment.parameters))
    assert not found, f"{path.name} rebinds parameters {found} after its parameters cell; use another name"


def test_the_rebinding_rule_catches_what_it_is_for():
    cells = [
        {
            "cell_type": "code",
            "metadata": {"tags": ["parameters"]},
            "source": ["preset = 'quick'\nseeds = [0]\n"],
        },
        {"cell_type": "code", "metadata": {}, "source": ["for preset in ('a', 'b'):\n    pass\n"]},
        {
            "cell_type": "code",
            "metadata": {},
            "source": ["rows = [seeds for seeds in range(3)]\nx = seeds\n"],
        },
        {"cell_type": "code", "metadata": {}, "source": ["with open('f') as seeds:\n    pass\n"]},
    ]
    assert rebound_parameters(cells, {"preset", "seeds"}) == ["preset (line 1)", "seeds (line 1)"]
