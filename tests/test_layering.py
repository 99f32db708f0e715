"""rlq's layers, enforced: every module belongs to a package, and imports only what its package may import.

The layers (docs: STYLE.md, "Layers"), bottom to top:

- ``rlq.core``: low-level helpers (validation, JSON I/O, parametrizations); imports nothing else of rlq.
- ``rlq.stats``: interval estimates over seeds (a module, not a package); imports nothing else of rlq.
- ``rlq.compress``, ``rlq.quant``: pure PyTorch transforms (ONNX Runtime allowed in quant); no RL library,
  no notebook or UI code, and not each other.
- ``rlq.rl``: environments, agents, evaluation, seeding, parallel jobs (Gymnasium and SB3 glue).
- ``rlq.sb3``, ``rlq.vision``: the integrations; side by side, so not each other.
- ``rlq.deploy``: the compiled runtime for compressed policies; reads the transforms' layers and SB3's
  action path.
- ``rlq.actorq``: distributed actor-learner training; its learner keeps a compressed SB3 policy (``rlq.sb3``'s
  checkpoints) and its actors may act with ``rlq.deploy``'s compiled policies.
- ``rlq.experiments``: registry, runner, run folders, results, presets, reuse, sweeps, paper numbers.
- ``rlq.claims``: the claims' specification, measures and verdicts, the confirmatory design and its campaign;
  reads published results through ``rlq.experiments``.
- ``rlq.analysis``: the tables and figures that notebooks and the report draw from results; may read the
  claims' measures, but not the experiment machinery.
- ``rlq.faces``: the CLI, report and widgets; nothing outside it imports it.

Every import counts, wherever it is (module level, inside a function, under ``TYPE_CHECKING``), and
relative imports are resolved against the importing module's package. ``rlq/__init__.py`` is only the
package root and is exempt; importing the root itself (``import rlq``, ``from rlq import record``) counts as
importing ``rlq.experiments``, since the root's ``record`` is ``rlq.experiments.run_folders.record``.

A new module must be placed: a file under ``rlq/`` outside every package of ``MAY_IMPORT`` fails.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

RLQ = Path(__file__).resolve().parent.parent / "rlq"

_BOTTOM = {"rlq.core", "rlq.stats"}
_TRANSFORMS = _BOTTOM | {"rlq.compress", "rlq.quant"}
_RL = _TRANSFORMS | {"rlq.rl"}
_INTEGRATIONS = _RL | {"rlq.sb3", "rlq.vision"}
_DEPLOYMENT = _INTEGRATIONS | {"rlq.deploy"}
_BELOW_EXPERIMENTS = _DEPLOYMENT | {"rlq.actorq"}

#: package -> the rlq packages its modules may import (itself included)
MAY_IMPORT: dict[str, set[str]] = {
    "rlq.core": {"rlq.core"},
    "rlq.stats": {"rlq.stats"},
    "rlq.compress": {"rlq.core", "rlq.compress"},
    "rlq.quant": {"rlq.core", "rlq.quant"},
    "rlq.rl": _RL,
    "rlq.sb3": _RL | {"rlq.sb3"},
    "rlq.vision": _RL | {"rlq.vision"},
    "rlq.deploy": _DEPLOYMENT,
    "rlq.actorq": _BELOW_EXPERIMENTS,
    "rlq.experiments": _BELOW_EXPERIMENTS | {"rlq.experiments"},
    "rlq.claims": _BELOW_EXPERIMENTS | {"rlq.experiments", "rlq.claims"},
    "rlq.analysis": _BELOW_EXPERIMENTS | {"rlq.claims", "rlq.analysis"},
    "rlq.faces": _BELOW_EXPERIMENTS | {"rlq.experiments", "rlq.claims", "rlq.analysis", "rlq.faces"},
}

#: modules exempt from the rules: the package root only re-exports
EXEMPT = {"rlq"}
#: what importing the root ``rlq`` itself counts as (its ``record`` is rlq.experiments.run_folders.record)
ROOT_COUNTS_AS = "rlq.experiments"

STANDARD_LIBRARY = set(sys.stdlib_module_names)
#: package -> the third-party top-level modules it may import besides the standard library; packages not
#: listed here may import any third-party module
THIRD_PARTY_ALLOWED: dict[str, set[str]] = {
    "rlq.compress": {"numpy", "torch"},
    "rlq.quant": {"numpy", "torch", "onnx", "onnxruntime"},
}
#: RL libraries and notebook or UI code: never below the RL helpers, even if an allow-list grows
DENIED = {
    "gym",
    "gymnasium",
    "stable_baselines3",
    "sb3_contrib",
    "ray",
    "dm_control",
    "gfootball",
    "ale_py",
    "shimmy",
    "mujoco",
    "papermill",
    "nbformat",
    "nbclient",
    "jupyter",
    "jupyterlab",
    "IPython",
    "ipykernel",
    "ipywidgets",
    "plotly",
    "matplotlib",
}
THIRD_PARTY_DENIED: dict[str, set[str]] = {
    "rlq.core": DENIED,
    "rlq.compress": DENIED,
    "rlq.quant": DENIED,
}


def module_name(path: Path, rlq_root: Path) -> str:
    """Return the dotted module name of ``path``, a file under the ``rlq`` folder ``rlq_root``."""
    parts = ("rlq", *path.relative_to(rlq_root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(name: str) -> str | None:
    """Return the package of ``MAY_IMPORT`` that holds the module ``name``, or None when none does."""
    for package in sorted(MAY_IMPORT, key=len, reverse=True):
        if name == package or name.startswith(package + "."):
            return package
    return None


def imports(path: Path, rlq_root: Path) -> list[tuple[int, str]]:
    """Return (line, absolute module name) for every import in ``path``, relative ones resolved.

    ``from package import name`` yields ``package.name`` when ``name`` is a module of rlq (a submodule
    or a subpackage), else ``package``.
    """
    module = module_name(path, rlq_root)
    is_package = path.name == "__init__.py"
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                sub = rlq_root.joinpath(*candidate.split(".")[1:])
                is_module = target.split(".")[0] == "rlq" and (
                    sub.with_suffix(".py").exists() or (sub / "__init__.py").exists()
                )
                found.append((node.lineno, candidate if is_module else target))
    return found


def file_violations(path: Path, rlq_root: Path) -> list[str]:
    """Return one message per broken rule in ``path``, a ``.py`` file under the ``rlq`` folder ``rlq_root``."""
    rel = f"rlq/{path.relative_to(rlq_root).as_posix()}"
    module = module_name(path, rlq_root)
    if module in EXEMPT:
        return []
    package = package_of(module)
    if package is None:
        return [
            f"{rel} ({module}) belongs to no package of the layering table: move it into one of "
            f"{', '.join(sorted(MAY_IMPORT))} (or add a package and its rule to MAY_IMPORT)"
        ]
    allowed = MAY_IMPORT[package]
    problems = []
    for line, name in imports(path, rlq_root):
        top = name.split(".")[0]
        where = f"{rel}:{line} ({package}) imports {name}"
        if top == "rlq":
            target = ROOT_COUNTS_AS if name in EXEMPT else package_of(name)
            if target is None:
                problems.append(f"{where}, which belongs to no package of the layering table")
            elif target not in allowed:
                via = f" (the root re-exports {ROOT_COUNTS_AS})" if name in EXEMPT else ""
                problems.append(f"{where}{via}: rule {package} may import only {', '.join(sorted(allowed))}")
        elif top in THIRD_PARTY_DENIED.get(package, set()):
            problems.append(f"{where}: rule {package} imports no RL library and no notebook or UI code")
        elif package in THIRD_PARTY_ALLOWED and top not in STANDARD_LIBRARY | THIRD_PARTY_ALLOWED[package]:
            problems.append(
                f"{where}: rule {package} may import only the standard library and "
                f"{', '.join(sorted(THIRD_PARTY_ALLOWED[package]))}"
            )
    return problems


def python_files(rlq_root: Path) -> list[Path]:
    return sorted(rlq_root.rglob("*.py"))


def violations(rlq_root: Path) -> list[str]:
    """Return every broken layering rule under the ``rlq`` folder ``rlq_root``."""
    return [message for path in python_files(rlq_root) for message in file_violations(path, rlq_root)]


# ---------------------------------------------------------------------------------------- the real tree


@pytest.mark.parametrize("path", python_files(RLQ), ids=lambda p: p.relative_to(RLQ.parent).as_posix())
def test_module_imports_only_what_its_layer_allows(path):
    problems = file_violations(path, RLQ)
    assert not problems, "\n".join(problems)


def test_every_package_of_the_table_exists():
    folder = RLQ.parent
    missing = [
        p
        for p in MAY_IMPORT
        if not (folder / p.replace(".", "/") / "__init__.py").exists()
        and not (folder / (p.replace(".", "/") + ".py")).exists()
    ]
    assert not missing, f"MAY_IMPORT names packages that do not exist: {missing}"


def test_the_table_runs_only_downward():
    # no package may import a face but the faces; nothing below the experiments imports them
    for package, allowed in MAY_IMPORT.items():
        assert package in allowed, package
        assert allowed <= set(MAY_IMPORT), package
        if package != "rlq.faces":
            assert "rlq.faces" not in allowed, package
        if package not in {"rlq.experiments", "rlq.claims", "rlq.faces"}:
            assert "rlq.experiments" not in allowed, package


# ----------------------------------------------------------------------------- the checker itself


def write(root: Path, rel: str, source: str) -> Path:
    """Write ``source`` to ``root/rel``, with the ``__init__.py`` files of every folder on the way."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = path.parent
    while folder != root:
        (folder / "__init__.py").touch()
        folder = folder.parent
    path.write_text(source)
    return path


@pytest.fixture
def fake_rlq(tmp_path) -> Path:
    """Return a fake ``rlq`` folder with one clean module per package of the table."""
    rlq_root = tmp_path / "rlq"
    rlq_root.mkdir()
    (rlq_root / "__init__.py").write_text("from rlq.experiments.run_folders import record\n")
    for package, allowed in MAY_IMPORT.items():
        lines = [f"import {p}.x" for p in sorted(allowed)]
        write(tmp_path, package.replace(".", "/") + "/x.py", "\n".join(lines) + "\n")
    write(tmp_path, "rlq/experiments/run_folders.py", "def record(**numbers):\n    pass\n")
    write(tmp_path, "rlq/faces/cli.py", "import rlq\n")
    return rlq_root


def test_checker_accepts_a_clean_tree(fake_rlq):
    assert violations(fake_rlq) == []


def test_checker_reports_an_upward_import_from_compress(fake_rlq):
    write(
        fake_rlq.parent,
        "rlq/compress/bad.py",
        "import torch\n\nfrom rlq.experiments.run_folders import record\n",
    )
    found = violations(fake_rlq)
    assert len(found) == 1, found
    assert "rlq/compress/bad.py:3" in found[0] and "rlq.experiments.run_folders" in found[0]
    assert "rlq.compress may import only rlq.compress, rlq.core" in found[0]


def test_checker_reports_a_face_imported_from_sb3(fake_rlq):
    write(fake_rlq.parent, "rlq/sb3/bad.py", "import rlq.faces.cli\n")
    found = violations(fake_rlq)
    assert len(found) == 1, found
    assert "rlq/sb3/bad.py:1" in found[0] and "imports rlq.faces.cli" in found[0]
    assert "rule rlq.sb3 may import only" in found[0]


def test_checker_sees_imports_inside_functions_and_relative_imports(fake_rlq):
    write(fake_rlq.parent, "rlq/rl/bad.py", "def f():\n    from ..sb3 import x\n    return x\n")
    write(fake_rlq.parent, "rlq/sb3/worse.py", "from ..actorq.x import y\n")
    write(fake_rlq.parent, "rlq/vision/ok.py", "from . import x\nfrom ..core import x as core_x\n")
    found = violations(fake_rlq)
    assert len(found) == 2, found
    assert any("rlq/rl/bad.py:2" in m and "imports rlq.sb3.x" in m for m in found), found
    assert any("rlq/sb3/worse.py:1" in m and "imports rlq.actorq.x" in m for m in found), found


def test_checker_counts_the_root_as_the_experiments(fake_rlq):
    write(fake_rlq.parent, "rlq/quant/bad.py", "import rlq\n")
    write(fake_rlq.parent, "rlq/rl/bad.py", "from rlq import record\n")
    write(fake_rlq.parent, "rlq/experiments/ok.py", "import rlq\nfrom rlq import faces\n")
    found = violations(fake_rlq)
    assert len(found) == 3, found
    assert any("rlq/experiments/ok.py:2" in m and "imports rlq.faces" in m for m in found), found
    assert sum("the root re-exports rlq.experiments" in m for m in found) == 2, found


def test_checker_reports_a_module_outside_every_package(fake_rlq):
    write(fake_rlq.parent, "rlq/newcomer.py", "import torch\n")
    write(fake_rlq.parent, "rlq/elsewhere/thing.py", "")
    found = violations(fake_rlq)
    assert len(found) == 3, found  # newcomer.py, elsewhere/__init__.py, elsewhere/thing.py
    assert any(m.startswith("rlq/newcomer.py (rlq.newcomer) belongs to no package") for m in found), found


def test_checker_reports_an_import_of_an_old_module_path(fake_rlq):
    write(fake_rlq.parent, "rlq/experiments/bad.py", "from rlq.runs import record\n")
    found = violations(fake_rlq)
    assert found == [
        "rlq/experiments/bad.py:1 (rlq.experiments) imports rlq.runs, which belongs to no package "
        "of the layering table"
    ], found


def test_checker_keeps_rl_and_ui_libraries_out_of_the_transforms(fake_rlq):
    write(fake_rlq.parent, "rlq/compress/bad.py", "def f():\n    import gymnasium\n")
    write(fake_rlq.parent, "rlq/compress/worse.py", "import pandas\nimport scipy.linalg\n")
    write(fake_rlq.parent, "rlq/quant/bad.py", "import onnxruntime\nfrom plotly import graph_objects\n")
    write(fake_rlq.parent, "rlq/core/bad.py", "from stable_baselines3 import PPO\n")
    write(
        fake_rlq.parent, "rlq/quant/ok.py", "import io, tempfile, warnings\nimport onnx\nimport numpy as np\n"
    )
    write(fake_rlq.parent, "rlq/rl/ok.py", "import gymnasium\nfrom stable_baselines3 import PPO\n")
    found = violations(fake_rlq)
    assert len(found) == 5, found
    assert any("rlq/compress/bad.py:2" in m and "no RL library" in m for m in found), found
    assert any("rlq/compress/worse.py:1" in m and "imports pandas" in m for m in found), found
    assert any("rlq/compress/worse.py:2" in m and "imports scipy.linalg" in m for m in found), found
    assert any("rlq/quant/bad.py:2" in m and "imports plotly" in m for m in found), found
    assert any("rlq/core/bad.py:1" in m and "no RL library" in m for m in found), found
