"""Shared fixtures: a tiny experiment notebook (fast papermill runs) and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from torch import nn

REPO = Path(__file__).resolve().parent.parent


def write_tiny_notebook(folder: Path, name: str = "tiny", requires: dict[str, str] | None = None) -> Path:
    """Write a small experiment notebook following rlq's conventions; it records what it was given.

    ``requires`` goes to ``metadata.rlq.requires`` (optional modules and how to install them).
    """
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    if requires is not None:
        nb.metadata["rlq"] = {"requires": requires}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Tiny: a test experiment\n\nRecords its parameters."),
        nbformat.v4.new_code_cell(
            'x = 1  # an int\nscale = 0.5  # a float\nlabel = "a"  # a string\nflag = False  # a bool\n'
            "sizes = [1, 2]  # a list\nfail = False  # raise at the end when true",
            metadata={"tags": ["parameters"]},
        ),
        nbformat.v4.new_code_cell(
            'PRESETS = {"quick": {"x": 2}, "paper": {"x": 3, "scale": 2.0}}\n'
            'PRESET_WALL_TIMES = {"quick": "5 s", "paper": "6 s"}',
            metadata={"tags": ["presets"]},
        ),
        nbformat.v4.new_code_cell(
            "import rlq\nrlq.record(total=x * scale, label=label, flag=flag, n_sizes=len(sizes))"
        ),
        nbformat.v4.new_code_cell('if fail:\n    raise RuntimeError("asked to fail")'),
    ]
    path = folder / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


def run_notebook_cell(notebook: str, starts_with: str, **names) -> dict:
    """Run the one code cell of ``notebooks/<notebook>.ipynb`` whose source starts with ``starts_with``.

    The cell sees only ``names`` (the tables it draws from and the modules the notebook imported for it); its
    namespace is returned, its last expression under ``"_"``.
    """
    import ast
    import json

    cells = json.loads((REPO / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]
    (source,) = [
        "".join(c["source"])
        for c in cells
        if c["cell_type"] == "code" and "".join(c["source"]).startswith(starts_with)
    ]
    tree = ast.parse(source)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        tree.body[-1] = ast.copy_location(
            ast.Assign(targets=[ast.Name("_", ast.Store())], value=last.value), last
        )
    ast.fix_missing_locations(tree)
    namespace = {"display": lambda *a, **k: None, **names}
    exec(compile(tree, f"<notebook {notebook}>", "exec"), namespace)
    return namespace


@pytest.fixture
def tiny_notebooks(tmp_path, monkeypatch) -> Path:
    """Return a notebooks folder holding only the tiny experiment, made the registry's folder."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    write_tiny_notebook(folder)
    monkeypatch.setenv("RLQ_NOTEBOOKS", str(folder))
    return folder


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Return the completed ``rlq`` command run in a fresh interpreter (real exit codes and streams)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "rlq.faces.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=600,
    )


DEPLOY_ALGOS = {
    "TD3": "Pendulum-v1",
    "DDPG": "Pendulum-v1",
    "SAC": "Pendulum-v1",
    "PPO": "Pendulum-v1",
    "A2C": "CartPole-v1",
    "DQN": "CartPole-v1",
}
"""Every algorithm rlq compresses, with the task its deployment tests act on (discrete: A2C, DQN)."""
DEPLOY_DISCRETE = {"A2C", "DQN"}


def circulant_deploy_models(seed: int) -> dict:
    """Untrained :data:`DEPLOY_ALGOS` models with a 64-64 action path whose hidden layer is block-circulant (B = 8)."""
    import torch

    from rlq.compress import block_circulant_
    from rlq.rl.agents import make_model
    from rlq.sb3.action_path import action_network

    torch.set_num_threads(1)
    built = {}
    for algo, env_id in DEPLOY_ALGOS.items():
        model = make_model(algo, env_id, seed=seed, hyperparams=dict(policy_kwargs=dict(net_arch=[64, 64])))
        assert block_circulant_(action_network(model)[0], 8).compressed, algo
        built[algo] = model
    return built


def relu_mlp(sizes=(6, 16, 16, 16, 3)) -> nn.Sequential:
    """Return a small ReLU MLP with the given layer widths (no activation after the last layer)."""
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def trained_td3_parameters(callbacks, steps: int = 160) -> list:
    """Return copies of every parameter of a tiny TD3 (Pendulum, 16-16, seed 0) after ``steps`` with ``callbacks``.

    Two such trainings differing only in a cache or memo must give the same bits: the tests of those caches
    compare them.
    """
    from rlq.rl.agents import make_model

    hyper = {
        "policy_kwargs": {"net_arch": [16, 16]},
        "learning_starts": 40,
        "buffer_size": 1000,
        "batch_size": 16,
    }
    model = make_model("TD3", "Pendulum-v1", seed=0, hyperparams=hyper)
    model.learn(steps, callback=callbacks)
    return [p.detach().clone() for p in model.policy.parameters()]


def interrupt_at(at: int):
    """Return an SB3 callback that stops training abruptly at step ``at`` (no on_training_end), as a kill would."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Interrupt(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps >= at:
                raise KeyboardInterrupt
            return True

    return Interrupt()


@pytest.fixture(params=[True, False], ids=["kernels", "fallback"])
def use_kernels(request):
    """Run the test with rlq.deploy's compiled kernels (skipped where they are not built), then with NumPy's."""
    from rlq.deploy import kernels_available

    if request.param and not kernels_available():
        pytest.skip("rlq.deploy._policy_kernels is not built")
    return request.param


@pytest.fixture
def one_thread():
    """Run the test with one PyTorch thread (tiny networks train fastest so, and the machine is shared)."""
    from rlq.quant.latency import torch_threads

    with torch_threads(1):
        yield
