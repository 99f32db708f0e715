"""The experiment registry: one notebook per experiment, its parameters cell and its presets.

An experiment is ``notebooks/<name>.ipynb``. Its first cell is markdown whose first line is the one-line
description; the cell tagged ``parameters`` holds ``name = literal  # comment`` lines only; the cell tagged
``presets`` holds two literals: ``PRESETS`` (preset name -> parameter overrides) and ``PRESET_WALL_TIMES``
(preset name -> expected wall time on 2 CPU cores). Everything here is parsed, never executed, so bad
input is caught before a kernel starts.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlq.experiments.constraints import Constraint, ConstraintError, check_value, parse_constraint
from rlq.experiments.paths import notebooks_dir

REQUIRED_PRESETS = ("quick", "paper")
log = logging.getLogger(__name__)


class ExperimentError(ValueError):
    """Bad input for an experiment: unknown name, parameter, preset or an unparsable value."""


@dataclass(frozen=True)
class Parameter:
    """One knob of an experiment's parameters cell."""

    name: str
    default: Any
    comment: str
    constraint: Constraint = field(default_factory=Constraint)
    """What a value must satisfy beyond its type (declared at the end of the comment; see
    :mod:`rlq.experiments.constraints`)."""

    def check(self, value: Any, source: str = "") -> None:
        """Raise ExperimentError naming the parameter (and ``source``) when ``value`` has the wrong type or breaks
        its constraint."""
        kind = type(self.default)
        fits = (
            self.default is None
            or (kind is float and isinstance(value, (int, float)) and not isinstance(value, bool))
            or (kind is int and isinstance(value, int) and not isinstance(value, bool))
            or (kind not in (int, float) and isinstance(value, kind))
        )
        if not fits:
            raise ExperimentError(
                f"parameter {self.name!r} expects {kind.__name__} (default {self.default!r}); got {value!r}"
                f"{f' ({source})' if source else ''}"
            )
        try:
            check_value(self.name, value, self.default, self.constraint)
        except ConstraintError as e:
            raise ExperimentError(f"{e}{f' ({source})' if source else ''}") from None

    @property
    def type_name(self) -> str:
        """Return the parameter's type as a short name (``int``, ``float``, ``str``, ...)."""
        return type(self.default).__name__


@dataclass(frozen=True)
class Experiment:
    """An experiment notebook as the runner sees it."""

    name: str
    path: Path
    description: str
    parameters: dict[str, Parameter]
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)
    wall_times: dict[str, str] = field(default_factory=dict)
    requires: dict[str, str] = field(default_factory=dict)
    """Optional modules the notebook needs (module -> how to install it), from ``metadata.rlq.requires``."""

    def missing(self) -> dict[str, str]:
        """Return the required modules that cannot be imported here, each with how to install it."""
        import importlib.util

        def absent(module: str) -> bool:
            try:
                return importlib.util.find_spec(module) is None
            except (ImportError, ValueError):
                return True

        return {module: how for module, how in self.requires.items() if absent(module)}

    def check_requirements(self) -> None:
        """Raise ExperimentError naming each missing optional module and how to install it."""
        missing = self.missing()
        if missing:
            raise ExperimentError(
                f"experiment {self.name!r} needs " + "; ".join(f"{m} ({how})" for m, how in missing.items())
            )

    def resolve(
        self, preset: str | None = None, overrides: list[tuple[str, str]] | None = None
    ) -> dict[str, Any]:
        """Return the full parameter dict: defaults, then the preset, then ``-p KEY VALUE`` overrides.

        A notebook with a ``preset`` parameter runs its default preset when none is named, and
        ``-p preset NAME`` means ``--preset NAME``.
        """
        values = {name: p.default for name, p in self.parameters.items()}
        sources = {name: "its default" for name in values}
        keys = [key for key, _ in overrides or []]
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        if repeated:
            raise ExperimentError(
                f"parameter(s) {', '.join(map(repr, repeated))} given more than once with -p"
            )
        if "preset" in self.parameters:
            named = [
                parse_value(text, self.parameters["preset"])
                for key, text in overrides or []
                if key == "preset"
            ]
            if named and preset is not None and named[0] != preset:
                raise ExperimentError(f"--preset {preset} and -p preset {named[0]} disagree")
            preset = (
                named[0] if named else preset if preset is not None else self.parameters["preset"].default
            )
            overrides = [(key, text) for key, text in overrides or [] if key != "preset"]
            values["preset"] = preset
        if preset is not None:
            if preset not in self.presets:
                raise ExperimentError(
                    f"experiment {self.name!r} has no preset {preset!r}; its presets are: {', '.join(self.presets)}"
                )
            values.update(self.presets[preset])
            sources.update({name: f"preset {preset!r}" for name in self.presets[preset]})
        for key, text in overrides or []:
            if key not in self.parameters:
                raise ExperimentError(
                    f"experiment {self.name!r} has no parameter {key!r}; its parameters are: "
                    f"{', '.join(self.parameters)}"
                )
            values[key] = parse_value(text, self.parameters[key])
            sources[key] = f"-p {key} {text}"
        for name, value in values.items():
            self.parameters[name].check(value, sources[name])
        return values


def _cell_source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _tagged(cells: list[dict[str, Any]], tag: str) -> dict[str, Any] | None:
    for cell in cells:
        if cell.get("cell_type") == "code" and tag in cell.get("metadata", {}).get("tags", []):
            return cell
    return None


def _literal_assignments(source: str, where: str) -> list[tuple[str, Any, int]]:
    """Return ``(name, value, line)`` for each ``name = literal`` statement; raise on anything else."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ExperimentError(f"{where}: syntax error: {e}") from e
    out = []
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
            target, value = node.target, node.value
        elif (
            isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        ):
            target, value = node.targets[0], node.value
        else:
            raise ExperimentError(
                f"{where}, line {node.lineno}: only `name = literal` statements are allowed"
            )
        try:
            literal = ast.literal_eval(value)
        except ValueError as e:
            raise ExperimentError(
                f"{where}, line {node.lineno}: {target.id} is not a literal (derive values in a later cell)"
            ) from e
        out.append((target.id, literal, node.lineno))
    return out


def _line_comments(source: str) -> dict[int, str]:
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    return comments


_BOOLEAN_WORDS = {word: True for word in ("true", "1", "yes", "on")} | {
    word: False for word in ("false", "0", "no", "off")
}


def parse_value(text: str, param: Parameter) -> Any:
    """Return ``text`` (from the command line) converted to ``param``'s type, or raise ExperimentError."""
    kind = type(param.default)
    bad = ExperimentError(
        f"parameter {param.name!r} expects {kind.__name__} (default {param.default!r}); got {text!r}"
    )
    if kind is str:
        return text
    try:
        if kind is bool:
            return _BOOLEAN_WORDS[text.strip().lower()]
        if kind in (int, float):
            return kind(text)
        value = ast.literal_eval(text)
    except (KeyError, ValueError, SyntaxError):
        if param.default is None:
            return text
        raise bad from None
    if param.default is not None and not isinstance(value, kind):
        raise bad
    return value


def _check_type(param: Parameter, value: Any, where: str) -> None:
    kind = type(param.default)
    ok = (
        param.default is None
        or isinstance(value, kind)
        and not (kind is int and isinstance(value, bool))
        or kind is float
        and isinstance(value, int)
        and not isinstance(value, bool)
    )
    if not ok:
        raise ExperimentError(f"{where}: {param.name}={value!r} is not a {kind.__name__} like its default")


def _description(cells: list[dict[str, Any]], path: Path) -> str:
    """Return the experiment's one-line description: the first line of its first cell, a markdown cell."""
    if not cells or cells[0].get("cell_type") != "markdown":
        raise ExperimentError(f"{path}: the first cell must be markdown describing the experiment")
    text = _cell_source(cells[0]).strip()
    return text.splitlines()[0].lstrip("#").strip() if text else ""


def _parameters(cells: list[dict[str, Any]], path: Path) -> dict[str, Parameter]:
    """Return the parameters the cell tagged ``parameters`` assigns, each with its comment and constraint."""
    params_cell = _tagged(cells, "parameters")
    if params_cell is None:
        raise ExperimentError(f"{path}: no cell tagged 'parameters'")
    source = _cell_source(params_cell)
    comments = _line_comments(source)
    parameters = {}
    for name, value, line in _literal_assignments(source, f"{path.name} parameters cell"):
        comment = comments.get(line, "")
        try:
            constraint = parse_constraint(comment, f"{path.name} parameters cell, {name}")
        except ConstraintError as e:
            raise ExperimentError(str(e)) from None
        parameters[name] = Parameter(name, value, comment, constraint)
    return parameters


def _presets(
    cells: list[dict[str, Any]], path: Path, parameters: dict[str, Parameter]
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Return the ``PRESETS`` and ``PRESET_WALL_TIMES`` of the cell tagged ``presets`` (none: both empty),
    each preset's values checked against the parameters they set."""
    presets_cell = _tagged(cells, "presets")
    if presets_cell is None:
        return {}, {}
    where = f"{path.name} presets cell"
    found = dict((n, v) for n, v, _ in _literal_assignments(_cell_source(presets_cell), where))
    presets = found.get("PRESETS", {})
    for preset, values in presets.items():
        if not isinstance(values, dict):
            raise ExperimentError(f"{where}: preset {preset!r} must be a dict of parameter values")
        for key, value in values.items():
            if key not in parameters:
                raise ExperimentError(f"{where}: preset {preset!r} sets unknown parameter {key!r}")
            _check_type(parameters[key], value, f"{where}, preset {preset!r}")
    return presets, found.get("PRESET_WALL_TIMES", {})


def load_experiment(path: str | Path) -> Experiment:
    """Return the Experiment described by the notebook at ``path`` (raises ExperimentError if malformed)."""
    path = Path(path)
    try:
        nb = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ExperimentError(f"{path}: not a readable notebook: {e}") from e
    cells = nb.get("cells", [])
    description = _description(cells, path)
    parameters = _parameters(cells, path)
    presets, wall_times = _presets(cells, path, parameters)
    if "preset" in parameters:
        choices = parameters["preset"].constraint.choices
        if set(choices or ()) != set(presets) or "preset" in {k for v in presets.values() for k in v}:
            raise ExperimentError(
                f"{path.name}: the preset parameter's choices must be the PRESETS names ({', '.join(presets)}), "
                "and no preset may set preset"
            )
    requires = nb.get("metadata", {}).get("rlq", {}).get("requires", {})
    if not isinstance(requires, dict) or not all(isinstance(v, str) for v in requires.values()):
        raise ExperimentError(f"{path}: metadata.rlq.requires must map module names to install hints")
    return Experiment(path.stem, path, description, parameters, presets, wall_times, dict(requires))


def is_experiment_notebook(path: str | Path) -> bool:
    """Return whether the notebook at ``path`` is an experiment: it has a cell tagged ``parameters``.

    Notebooks without one (an ``Untitled.ipynb`` JupyterLab created, a scratch notebook) are not listed or
    run, nor is an empty file (0 bytes), which is logged as a warning; a file that is not valid JSON counts as
    one, so that loading it names the damage.
    """
    text = Path(path).read_text()
    if not text.strip():
        log.warning("rlq: skipping %s: the file is empty (%d bytes), not a notebook", path, len(text))
        return False
    try:
        cells = json.loads(text).get("cells", [])
    except (ValueError, AttributeError):
        return True
    return any("parameters" in (cell.get("metadata", {}).get("tags") or []) for cell in cells)


def _notebooks(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.glob("*.ipynb")) if is_experiment_notebook(p)]


def list_experiments(folder: str | Path | None = None) -> list[Experiment]:
    """Return every experiment notebook in ``folder`` (default: the repository's ``notebooks/``), by name."""
    folder = Path(folder) if folder is not None else notebooks_dir()
    return [load_experiment(p) for p in _notebooks(folder)]


def get_experiment(name: str, folder: str | Path | None = None) -> Experiment:
    """Return the experiment called ``name``, or raise ExperimentError listing the known ones."""
    folder = Path(folder) if folder is not None else notebooks_dir()
    path = folder / f"{name}.ipynb"
    if "/" in name or not path.is_file() or not is_experiment_notebook(path):
        known = ", ".join(p.stem for p in _notebooks(folder)) or "(none)"
        raise ExperimentError(f"unknown experiment {name!r}; known experiments: {known}")
    return load_experiment(path)
