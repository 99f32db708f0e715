"""rlq.compress is pure PyTorch: it imports no RL library, no notebook or UI code, and no other rlq layer
(only rlq.parametrizations, a torch helper beneath every layer)."""

from __future__ import annotations

import ast
from pathlib import Path

import rlq.compress

STANDARD_LIBRARY = {
    "__future__",
    "collections",
    "copy",
    "functools",
    "dataclasses",
    "itertools",
    "math",
    "statistics",
    "time",
    "types",
}
ALLOWED_TOP_LEVEL = STANDARD_LIBRARY | {"typing", "numpy", "torch", "rlq"}
#: rlq modules below every layer (pure torch helpers that compress and quant share)
BASE_MODULES = {"rlq.parametrizations"}


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_compress_imports_only_torch_numpy_and_itself():
    folder = Path(rlq.compress.__file__).parent
    for path in sorted(folder.glob("*.py")):
        for name in imported_modules(path):
            assert name.split(".")[0] in ALLOWED_TOP_LEVEL, f"{path.name} imports {name}"
            if name.startswith("rlq") and name not in BASE_MODULES:
                assert name.startswith("rlq.compress"), (
                    f"{path.name} imports {name}: an upward or sideways import"
                )
