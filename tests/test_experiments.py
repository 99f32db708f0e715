"""Parsing notebooks into experiments: literal parameters, typed overrides, validated presets."""

from __future__ import annotations

import nbformat
import pytest

from conftest import write_tiny_notebook
from rlq.experiments.registry import ExperimentError, Parameter, load_experiment, parse_value


@pytest.mark.parametrize(
    "default, text, expected",
    [
        (1, "7", 7),
        (1, "-3", -3),
        (0.5, "1e-3", 1e-3),
        (0.5, "2", 2.0),
        ("a", "b c", "b c"),
        (False, "TRUE", True),
        (True, "no", False),
        ([1], "[2, 3]", [2, 3]),
        ({}, '{"lr": 0.1}', {"lr": 0.1}),
        (None, "3", 3),
        (None, "abc", "abc"),
    ],
)
def test_parse_value_converts_to_the_default_type(default, text, expected):
    value = parse_value(text, Parameter("p", default, ""))
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    "default, text", [(1, "1.0"), (1, "one"), (0.5, "x"), (True, "2"), ([1], "{}"), ({}, "[")]
)
def test_parse_value_rejects_wrong_types(default, text):
    with pytest.raises(ExperimentError, match="parameter 'p' expects"):
        parse_value(text, Parameter("p", default, ""))


def test_load_experiment_reads_parameters_comments_presets(tmp_path):
    exp = load_experiment(write_tiny_notebook(tmp_path))
    assert exp.name == "tiny" and exp.description == "Tiny: a test experiment"
    assert list(exp.parameters) == ["x", "scale", "label", "flag", "sizes", "fail"]
    assert exp.parameters["scale"].comment == "a float" and exp.parameters["scale"].default == 0.5
    assert exp.presets["paper"] == {"x": 3, "scale": 2.0} and exp.wall_times["quick"] == "5 s"
    assert exp.resolve("quick", [("scale", "3")])["x"] == 2


def _with_cell(tmp_path, tag: str, source: str):
    path = write_tiny_notebook(tmp_path)
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if tag in cell.metadata.get("tags", []):
            cell.source = source
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize(
    "tag, source, message",
    [
        ("parameters", "x = 1\ny = x * 2  # derived", "y is not a literal"),
        ("parameters", "import os", "only `name = literal`"),
        ("presets", 'PRESETS = {"quick": {"nosuch": 1}}', "unknown parameter 'nosuch'"),
        ("presets", 'PRESETS = {"quick": {"x": "two"}}', "is not a int"),
        ("presets", 'PRESETS = {"quick": 3}', "must be a dict"),
    ],
)
def test_malformed_notebooks_are_rejected_with_the_reason(tmp_path, tag, source, message):
    with pytest.raises(ExperimentError, match=message):
        load_experiment(_with_cell(tmp_path, tag, source))
