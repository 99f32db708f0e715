"""Every committed notebook follows rlq's conventions and runs through `rlq run` at its quick preset."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import papermill as pm
import pytest

from conftest import run_cli
from rlq.experiments import REQUIRED_PRESETS, get_experiment, list_experiments

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
NAMES = [p.stem for p in NOTEBOOKS]


def test_there_are_notebooks():
    assert "baseline_rl" in NAMES


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_committed_notebook_has_no_outputs_and_a_kernelspec(path):
    nb = json.loads(path.read_text())
    dirty = [
        i
        for i, c in enumerate(nb["cells"])
        if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))
    ]
    assert not dirty, f"{path.name}: cells {dirty} hold outputs; strip them (nbstripout) before committing"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    assert nb["metadata"]["kernelspec"]["language"] == "python"


def test_experiment_conventions():
    for exp in list_experiments():
        assert exp.description, f"{exp.name}: first markdown line must describe the experiment"
        for preset in REQUIRED_PRESETS:
            assert preset in exp.presets, f"{exp.name}: missing preset {preset!r}"
        assert set(exp.wall_times) == set(exp.presets), f"{exp.name}: every preset needs a wall time"
        for p in exp.parameters.values():
            assert p.comment, f"{exp.name}: parameter {p.name} needs a comment saying what it is"
        # papermill's own parser must see the same parameters (it warns about any line it cannot read)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            seen = pm.inspect_notebook(str(exp.path))
        assert list(seen) == list(exp.parameters), f"{exp.name}: papermill reads {list(seen)}"
        nb = json.loads(exp.path.read_text())
        assert nb["cells"][1]["metadata"].get("tags") == ["parameters"], (
            f"{exp.name}: parameters must be cell 2"
        )


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_at_quick_preset(name, tmp_path):
    missing = get_experiment(name).missing()
    if missing and os.environ.get("RLQ_REQUIRE_FOOTBALL") != "1":  # CI sets it after `make football`
        pytest.skip(f"{name} needs {', '.join(f'{m} ({how})' for m, how in missing.items())}")
    result = run_cli("run", name, "--preset", "quick", "--out", str(tmp_path), "--quiet")
    run_dir = Path(result.stdout.strip().splitlines()[-1])
    results = json.loads((run_dir / "results.json").read_text())
    assert result.returncode == 0 and results["status"] == "ok", results.get("error", result.stderr[-3000:])
    assert (run_dir / "output.ipynb").exists() and (run_dir / "params.json").exists()
    if name == "baseline_rl":
        # PPO on CartPole must clearly learn: far above the random policy on the same evaluation seeds
        assert results["final_mean_return"] > max(150, 5 * results["random_mean_return"])
        assert 10 < results["random_mean_return"] < 50
        assert (run_dir / "curve.csv").exists() and list((run_dir / "checkpoints").glob("model_*_steps.zip"))
