"""A preset chosen in a notebook's parameters cell: ``preset = "medium"`` means what ``rlq run --preset medium`` means.

A notebook's parameters cell names ``preset`` first; the cell after its ``PRESETS`` cell calls
:func:`apply_preset`, which sets the chosen preset's values in the notebook's namespace. Values that papermill
injected (``papermill -p NAME VALUE``, and every value ``rlq run`` resolved) win over the preset's: they are
the names assigned in papermill's injected-parameters cell, read from the kernel's input history (IPython's
``In``). In JupyterLab, without an injected cell, the preset's values replace the parameters cell's values
for the names the preset lists; a value changed after that cell keeps the change.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

#: the first line of the cell papermill injects after a notebook's parameters cell
INJECTED_HEADER = "# Parameters"


def injected_names(history: Sequence[str]) -> set[str]:
    """Return the names assigned by the latest papermill injected-parameters cell in a kernel's input history."""
    for source in reversed(list(history)):
        if isinstance(source, str) and source.lstrip().startswith(INJECTED_HEADER + "\n"):
            tree = ast.parse(source)
            return {
                target.id
                for node in tree.body
                if isinstance(node, ast.Assign)
                for target in node.targets
                if isinstance(target, ast.Name)
            }
    return set()


def apply_preset(
    namespace: MutableMapping[str, Any],
    presets: Mapping[str, Mapping[str, Any]],
    preset: str,
    history: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Set preset ``preset``'s values in ``namespace`` except those papermill injected; return the values set.

    ``history`` is the kernel's input history (default: ``namespace["In"]``, IPython's). An unknown preset
    raises ValueError naming the known ones.
    """
    if preset not in presets:
        raise ValueError(f"unknown preset {preset!r}; the presets are: {', '.join(presets)}")
    if history is None:
        history = namespace.get("In", [])
    kept = injected_names(history)
    applied = {name: copy.deepcopy(value) for name, value in presets[preset].items() if name not in kept}
    namespace.update(applied)
    print(preset_line(preset, applied, sorted(kept & set(presets[preset]))))
    return applied


def preset_line(preset: str, applied: Mapping[str, Any], kept: Sequence[str]) -> str:
    """Return the one line a notebook prints after applying a preset."""
    if not applied:
        return f"preset {preset!r}: every value it names came with papermill's parameters (rlq run, or -p)"
    line = f"preset {preset!r}: {len(applied)} value(s) set from PRESETS"
    if kept:
        line += f"; kept from papermill's parameters: {', '.join(kept)}"
    return line
