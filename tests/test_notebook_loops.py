"""A notebook that owns its loop: its per-run function calls ``model.learn`` within two rlq frames of its cell.

The notebook's cells run in order, at the quick preset, until the first ``learn`` call of an SB3 algorithm;
the stack at that call is read from the learn back to the nearest frame of a notebook cell, and every frame
of rlq's own files in between counts. The cell's function calling ``model.learn`` itself counts 0. ActorQ's
notebook trains through ActorQ's own learner loop, ``rlq.actorq.train``, and is read the same way at that call.
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import pytest
import stable_baselines3
from stable_baselines3.common.base_class import BaseAlgorithm

ROOT = Path(__file__).resolve().parent.parent
RLQ = ROOT / "rlq"
MAX_RLQ_FRAMES = 2
"""How many rlq frames may stand between a notebook cell and ``model.learn``."""
OWN_LOOP = [
    "gst_td3_mujoco", "gst_a2c_atari", "gst_sweep", "gst_ppo_football", "quarl_qat", "quarl_ptq", "baseline_rl",
    "combo_sparse_quant", "gst_block_deploy",
]  # fmt: skip
"""The notebooks whose per-run function, defined in a cell, trains with ``model.learn``."""
OWN_ACTORQ_LOOP = ["quarl_actorq"]
"""The notebooks whose per-run function, defined in a cell, trains with ActorQ's learner loop, ``rlq.actorq.train``."""


class LearnReached(BaseException):
    """Raised at the first ``learn`` (a BaseException: job runners keep going after an Exception)."""

    def __init__(self, stack: traceback.StackSummary, callback):
        super().__init__("learn reached")
        self.stack, self.callback = stack, callback  # learn's callback, or the ActorQConfig that train got


def cell_name(notebook: str, index: int) -> str:
    return f"<notebook {notebook} cell {index}>"


def rlq_frames_to_learn(stack: traceback.StackSummary, notebook: str) -> list[str]:
    """Return the rlq frames between the innermost frame of ``notebook``'s cells and the learn call (outer first)."""
    frames = list(stack)
    cell_frames = [i for i, f in enumerate(frames) if f.filename.startswith(f"<notebook {notebook} cell ")]
    assert cell_frames, f"no frame of {notebook}'s cells on the stack: {[f.filename for f in frames]}"
    between = frames[cell_frames[-1] + 1 :]
    return [
        f"{Path(f.filename).relative_to(ROOT)}:{f.name}"
        for f in between
        if Path(f.filename).is_relative_to(RLQ)
    ]


def run_until_learn(notebook: str, monkeypatch, run_folder: Path) -> LearnReached:
    """Run ``notebook``'s code cells in order (its defaults: the quick preset) until the first SB3 learn."""

    def learn(self, *args, **kwargs):
        # the frames outside this one, outer first
        raise LearnReached(traceback.extract_stack()[:-1], kwargs.get("callback"))

    monkeypatch.setattr(BaseAlgorithm, "learn", learn)
    for subclass in _all_subclasses(BaseAlgorithm):
        if "learn" in vars(subclass):
            monkeypatch.setattr(subclass, "learn", learn)
    return run_until_reached(notebook, monkeypatch, run_folder)


def run_until_reached(notebook: str, monkeypatch, run_folder: Path) -> LearnReached:
    """Run ``notebook``'s code cells in order in ``run_folder`` until one raises :class:`LearnReached`."""
    from rlq.experiments.registry import get_experiment

    missing = get_experiment(notebook).missing()
    if missing:
        pytest.skip(f"{notebook} needs {', '.join(f'{m} ({how})' for m, how in missing.items())}")
    monkeypatch.setenv("RLQ_RUN_DIR", str(run_folder))
    monkeypatch.chdir(run_folder)
    cells = json.loads((ROOT / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]
    namespace = {"__name__": "__main__", "display": lambda *a, **k: None}
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        try:
            exec(compile("".join(cell["source"]), cell_name(notebook, index), "exec"), namespace)
        except LearnReached as reached:
            return reached
    pytest.fail(f"{notebook} ran to its end without calling its training loop")


def _all_subclasses(cls: type) -> list[type]:
    """Return every subclass of ``cls``, SB3's algorithms (``stable_baselines3.__all__``) loaded first."""
    assert stable_baselines3.TD3 is not None
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_all_subclasses(sub)]
    return found


@pytest.mark.parametrize("notebook", OWN_LOOP)
def test_the_cell_reaches_model_learn_within_two_rlq_frames(notebook, monkeypatch, tmp_path):
    reached = run_until_learn(notebook, monkeypatch, tmp_path)
    frames = rlq_frames_to_learn(reached.stack, notebook)
    assert len(frames) <= MAX_RLQ_FRAMES, (
        f"{notebook}: {len(frames)} rlq frames from its cell to learn: {frames}"
    )


@pytest.mark.parametrize("notebook", OWN_LOOP)
def test_the_loop_keeps_its_checkpoints_and_resume(notebook, monkeypatch, tmp_path):
    from rlq.rl.resume import Checkpoints

    reached = run_until_learn(notebook, monkeypatch, tmp_path)
    callbacks = reached.callback if isinstance(reached.callback, list) else [reached.callback]
    assert any(isinstance(c, Checkpoints) for c in callbacks), (
        f"{notebook}: learn gets no Checkpoints: {callbacks}"
    )


def test_the_depth_count_sees_rlq_frames_between_the_cell_and_learn():
    """The count is of rlq files only, and only those inside the cell's call."""
    stack = traceback.StackSummary.from_list([
        (str(RLQ / "experiments" / "notebook_jobs.py"), 1, "run_notebook_jobs", ""),
        (cell_name("nb", 7), 3, "train_one", ""),
        (str(RLQ / "rl" / "agents.py"), 10, "train_agent", ""),
        ("/usr/lib/python3/site-packages/x.py", 5, "helper", ""),
        (str(RLQ / "rl" / "agents.py"), 20, "_learn", ""),
    ])  # fmt: skip
    assert rlq_frames_to_learn(stack, "nb") == ["rlq/rl/agents.py:train_agent", "rlq/rl/agents.py:_learn"]


@pytest.mark.parametrize("notebook", OWN_ACTORQ_LOOP)
def test_the_cell_calls_actorq_s_learner_loop_itself(notebook, monkeypatch, tmp_path):
    import rlq.actorq
    import rlq.actorq.driver

    def train(config, callback=None):
        raise LearnReached(traceback.extract_stack()[:-1], config)

    monkeypatch.setattr(rlq.actorq.driver, "train", train)
    monkeypatch.setattr(rlq.actorq, "train", train, raising=False)
    reached = run_until_reached(notebook, monkeypatch, tmp_path)
    frames = rlq_frames_to_learn(reached.stack, notebook)
    assert len(frames) <= MAX_RLQ_FRAMES, (
        f"{notebook}: {len(frames)} rlq frames from its cell to train: {frames}"
    )
    config = (
        reached.callback
    )  # the first run: the quick preset's first task with fp32 actors, in the run folder
    assert isinstance(config, rlq.actorq.ActorQConfig) and config.actor_precision == "fp32"
    assert Path(config.checkpoint_dir).is_relative_to(tmp_path)
