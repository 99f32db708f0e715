"""A preset chosen in the parameters cell: the same values as ``rlq run --preset``; papermill's -p wins."""

from __future__ import annotations

import json

import nbformat
import papermill as pm
import pytest

from rlq.experiments.presets import apply_preset, injected_names
from rlq.experiments.registry import ExperimentError, list_experiments, load_experiment

PRESETS = {"quick": {"x": 2}, "paper": {"x": 3, "scale": 2.0}}


def preset_notebook(folder, choices: str = "quick|paper"):
    """Write a notebook with a preset parameter, a presets cell and the cell that applies the preset."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Presets: a test experiment"),
        nbformat.v4.new_code_cell(
            f'preset = "quick"  # the preset [choices: {choices}]\nx = 1  # an int\nscale = 0.5  # a float',
            metadata={"tags": ["parameters"]},
        ),
        nbformat.v4.new_code_cell(
            f'PRESETS = {PRESETS!r}\nPRESET_WALL_TIMES = {{"quick": "1 s", "paper": "2 s"}}',
            metadata={"tags": ["presets"]},
        ),
        nbformat.v4.new_code_cell(
            "from rlq.experiments.presets import apply_preset\n\napply_preset(globals(), PRESETS, preset)"
        ),
        nbformat.v4.new_code_cell(
            "import json, pathlib\npathlib.Path(out).write_text(json.dumps({'x': x, 'scale': scale}))"
        ),
    ]
    path = folder / "presets.ipynb"
    nbformat.write(nb, path)
    return path


def test_injected_names_reads_the_latest_papermill_cell():
    history = ["", "x = 1", "# Parameters\nx = 5\n", "y = 2", "# Parameters\nscale = 3.0\npreset = 'paper'\n"]
    assert injected_names(history) == {"scale", "preset"}
    assert injected_names(["x = 1", "# a comment\nx = 2"]) == set()


def test_apply_preset_keeps_injected_values_and_rejects_unknown_presets():
    namespace = {"x": 1, "scale": 9.0}
    applied = apply_preset(namespace, PRESETS, "paper", history=["# Parameters\nscale = 9.0\n"])
    assert applied == {"x": 3} and namespace == {"x": 3, "scale": 9.0}
    namespace = {"x": 1, "scale": 0.5}
    assert apply_preset(namespace, PRESETS, "paper", history=[]) == {"x": 3, "scale": 2.0}
    with pytest.raises(ValueError, match="unknown preset 'medium'; the presets are: quick, paper"):
        apply_preset(namespace, PRESETS, "medium", history=[])


@pytest.mark.slow
@pytest.mark.parametrize(
    "parameters, expected",
    [
        ({}, {"x": 2, "scale": 0.5}),  # the cell's own preset, quick
        ({"preset": "paper"}, {"x": 3, "scale": 2.0}),
        ({"preset": "paper", "scale": 7.0}, {"x": 3, "scale": 7.0}),  # -p wins over the preset
    ],
)
def test_papermill_runs_the_chosen_preset_and_its_overrides_win(tmp_path, parameters, expected):
    path = preset_notebook(tmp_path)
    out = tmp_path / "values.json"
    pm.execute_notebook(str(path), str(tmp_path / "out.ipynb"), parameters={**parameters, "out": str(out)},
                        kernel_name="python3", progress_bar=False)  # fmt: skip
    assert json.loads(out.read_text()) == expected


def test_rlq_run_resolution_of_the_preset_parameter(tmp_path):
    exp = load_experiment(preset_notebook(tmp_path))
    assert exp.resolve() == {"preset": "quick", "x": 2, "scale": 0.5}
    assert exp.resolve("paper", [("scale", "4")]) == {"preset": "paper", "x": 3, "scale": 4.0}
    assert exp.resolve(None, [("preset", "paper")]) == {"preset": "paper", "x": 3, "scale": 2.0}
    with pytest.raises(ExperimentError, match="--preset quick and -p preset paper disagree"):
        exp.resolve("quick", [("preset", "paper")])
    with pytest.raises(ExperimentError, match="'preset' given more than once"):
        exp.resolve(None, [("preset", "paper"), ("preset", "quick")])


def test_a_preset_parameter_must_offer_exactly_the_presets(tmp_path):
    with pytest.raises(ExperimentError, match="choices must be the PRESETS names"):
        load_experiment(preset_notebook(tmp_path, choices="quick|medium"))


def test_every_notebook_chooses_its_preset_in_the_parameters_cell():
    for exp in list_experiments():
        assert "preset" in exp.parameters and exp.parameters["preset"].default == "quick", exp.name
        assert list(exp.parameters)[0] == "preset", f"{exp.name}: preset comes first in the parameters cell"
        cells = json.loads(exp.path.read_text())["cells"]
        at = next(i for i, c in enumerate(cells) if "presets" in c["metadata"].get("tags", []))
        assert "apply_preset(globals(), PRESETS, preset)" in "".join(cells[at + 1]["source"]), exp.name
