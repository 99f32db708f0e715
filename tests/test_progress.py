"""Live progress: events in a file, bars and log lines from them, SB3 trainings reporting, and `rlq run` showing it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time

import nbformat
import pytest

from rlq.core import progress
from rlq.core.progress import PROGRESS_FILE_ENV, ProgressReader, emit
from rlq.core.progress_board import Board, Follower, terminal_board

ON_POLICY = {"n_steps": 32, "batch_size": 32, "policy_kwargs": {"net_arch": [8]}}


@pytest.fixture
def events_file(tmp_path, monkeypatch):
    """Return a progress file that emit() appends to, as under `rlq run`."""
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(PROGRESS_FILE_ENV, str(path))
    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    return path


def test_events_are_json_lines_and_a_reader_takes_only_complete_new_ones(events_file):
    emit("train_start", id="a", label="one", steps=0, total=10)
    reader = ProgressReader(events_file, from_end=False)
    assert [e["event"] for e in reader.read()] == ["train_start"]
    with open(events_file, "a") as f:
        f.write('{"event": "train", "id": "a", "steps": 5}\n{"event": "tra')  # a line half written
    assert [e["steps"] for e in reader.read()] == [5]
    with open(events_file, "a") as f:
        f.write('in", "id": "a", "steps": 7}\nnot json\n')
    assert [e["steps"] for e in reader.read()] == [7] and reader.read() == []
    assert ProgressReader(events_file).read() == []  # a new reader starts at the end (an earlier attempt's)
    event = json.loads(events_file.read_text().splitlines()[0])
    assert event["pid"] == os.getpid() and event["total"] == 10 and event["t"] > 0


def test_nobody_listening_means_no_event(monkeypatch):
    monkeypatch.delenv(PROGRESS_FILE_ENV, raising=False)
    assert not progress.shows_here()  # pytest captures stderr: no terminal, no Jupyter
    assert emit("train_start", id="a") is None
    monkeypatch.setenv(progress.PROGRESS_ENV, "0")
    monkeypatch.setenv(PROGRESS_FILE_ENV, "/nonexistent/progress.jsonl")
    assert not progress.enabled() and emit("train", id="a") is None


def batch_events() -> list[dict]:
    """Two jobs of one batch: the first trains and ends, the second fails mid-training."""
    return [
        {"event": "jobs", "ids": ["b.0", "b.1"], "labels": ["seed 0, method gst", "seed 1"]},
        {"event": "job_start", "id": "b.0"},
        {"event": "job_start", "id": "b.1"},
        {"event": "train_start", "id": "b.0", "steps": 0, "total": 1000},
        {"event": "train", "id": "b.0", "steps": 400, "total": 1000, "return": 12.5},
        {"event": "train_start", "id": "b.1", "steps": 200, "total": 1000},
        {"event": "train_end", "id": "b.0", "status": "ok", "steps": 1000, "trained": 1000, "seconds": 4.0},
        {"event": "job_end", "id": "b.0", "status": "ok", "seconds": 5.0},
        {"event": "train", "id": "b.1", "steps": 300},
        {"event": "job_end", "id": "b.1", "status": "failed", "error": "ValueError: bad", "seconds": 2},
    ]


def test_lines_board_writes_one_line_per_finished_job():
    stream = io.StringIO()
    board = Board("lines", stream=stream)
    for event in batch_events():
        board.handle(event)
    board.close()
    assert stream.getvalue().splitlines() == [
        "rlq: [1/2] seed 0, method gst: done in 00:05; 1,000 steps in 00:04 (250 steps/s), return 12.5",
        "rlq: [2/2, 1 failed] seed 1: failed after 00:02 at step 300: ValueError: bad",
    ]


def test_a_training_outside_jobs_is_its_own_line_and_a_skipped_one_says_so():
    stream = io.StringIO()
    board = Board("lines", stream=stream)
    board.handle(
        {"event": "train_start", "id": "x", "label": "PPO CartPole-v1 seed 0", "steps": 0, "total": 64}
    )
    board.handle({"event": "train_end", "id": "x", "status": "ok", "steps": 64, "trained": 64, "seconds": 2})
    board.handle(
        {"event": "train_end", "id": "y", "label": "DQN", "status": "skipped", "steps": 50, "total": 50}
    )
    board.handle({"event": "no_such_event", "id": "z"})
    board.handle({"event": "train", "steps": 3})  # no id: ignored, not fatal
    assert stream.getvalue().splitlines() == [
        "rlq: PPO CartPole-v1 seed 0: trained 64 steps in 00:02 (32 steps/s)",
        "rlq: DQN: already trained (50 steps)",
    ]


def test_bars_board_shows_steps_rate_time_left_and_return():
    stream = io.StringIO()
    board = Board("bars", stream=stream)
    for event in batch_events()[:5]:
        board.handle(event)
    drawn = stream.getvalue()
    assert "seed 0, method gst" in drawn and "400/1.00k" in drawn and "return 12.5" in drawn
    assert "jobs" in drawn and "2 running" in drawn and "step/s" in drawn
    for event in batch_events()[5:]:
        board.handle(event)
    board.close()
    assert "rlq: [1/2] seed 0, method gst: done" in stream.getvalue()  # finished jobs as lines above the bars


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_board_draws_bars_only_on_a_terminal():
    assert terminal_board(FakeTerminal()).mode == "bars"
    assert terminal_board(io.StringIO()).mode == "lines"


def test_follower_shows_what_another_writer_appends(events_file):
    events_file.write_text(
        '{"event": "train_end", "id": "old", "status": "ok", "steps": 1}\n'
    )  # earlier attempt
    stream = io.StringIO()
    follower = Follower(events_file, Board("lines", stream=stream), every=0.05).start()
    for event in batch_events():
        emit(**event)
    deadline = time.monotonic() + 10
    while stream.getvalue().count("\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stream.getvalue().count("\n") == 2  # shown while following, before stop()
    follower.stop()
    assert "old" not in stream.getvalue()


def test_train_agent_reports_start_updates_end_and_an_already_trained_run(events_file, tmp_path, monkeypatch):
    from rlq.rl.agents import train_agent

    monkeypatch.setattr(progress, "PROGRESS_SECONDS", 0.0)
    from rlq.rl.agents import make_model
    from rlq.rl.resume import Checkpoints

    for _ in range(2):  # the second has nothing left to train
        train_agent(
            make_model("PPO", "CartPole-v1", seed=0, hyperparams=ON_POLICY),
            64,
            Checkpoints(tmp_path / "qat8"),
        )
    events = ProgressReader(events_file, from_end=False).read()
    kinds = [e["event"] for e in events]
    assert kinds[0] == "train_start" and "train" in kinds and kinds[-2:] == ["train_end", "train_end"]
    start, end, skipped = events[0], events[-2], events[-1]
    assert start["label"] == "PPO CartPole-v1 seed 0 (qat8)" and start["total"] == 64
    assert end["status"] == "ok" and end["steps"] == end["trained"] == 64 and end["seconds"] > 0
    assert skipped["status"] == "skipped" and skipped["steps"] == 64
    updates = [e for e in events if e["event"] == "train"]
    assert all(e["id"] == start["id"] for e in updates) and updates[-1]["steps"] <= 64


def test_a_job_reports_its_start_end_and_failure_and_trainings_report_under_it(events_file):
    from rlq.rl.parallel import run_jobs

    def train_inside(n: int) -> int:
        job_id, _ = progress.current_job()
        emit("train_start", id=job_id, steps=0, total=n)
        if n < 0:
            raise ValueError("negative")
        return n

    assert run_jobs(train_inside, [{"n": 3}], labels=["three"]) == [3]
    with pytest.raises(ValueError):
        run_jobs(train_inside, [{"n": -1}])
    events = ProgressReader(events_file, from_end=False).read()
    assert [e["event"] for e in events[:4]] == ["jobs", "job_start", "train_start", "job_end"]
    assert events[0]["labels"] == ["three"] and events[2]["id"] == events[1]["id"] == events[0]["ids"][0]
    failed = events[-1]
    assert failed["status"] == "failed" and failed["error"] == "ValueError: negative"
    assert progress.current_job() is None
    with pytest.raises(ValueError, match="2 labels for 1 jobs"):
        run_jobs(train_inside, [{"n": 1}], labels=["a", "b"])


# --------------------------------------------------------------------------------------------------------
# rlq run: a tiny notebook whose jobs wait for the test to have seen their lines


def write_jobs_notebook(folder) -> None:
    """An experiment running two jobs through run_jobs, then waiting for a ``go`` file before it ends."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Jobs: a test experiment with two jobs"),
        nbformat.v4.new_code_cell(
            "pause = 0.2  # seconds per job [min: 0]", metadata={"tags": ["parameters"]}
        ),
        nbformat.v4.new_code_cell(
            "import pathlib, time\n"
            "from rlq.core import progress\n"
            "from rlq.rl.parallel import run_jobs\n"
            "def job(steps):\n"
            "    job_id, _ = progress.current_job()\n"
            "    progress.emit('train_start', id=job_id, steps=0, total=steps)\n"
            "    time.sleep(pause)\n"
            "    progress.emit('train_end', id=job_id, status='ok', steps=steps, trained=steps, seconds=pause)\n"
            "    return steps\n"
            "run_jobs(job, [{'steps': 100}, {'steps': 200}], labels=['first', 'second'])\n"
            "start = time.time()\n"
            "while not pathlib.Path('go').exists() and time.time() - start < 120:\n"
            "    time.sleep(0.1)\n"
            "assert pathlib.Path('go').exists(), 'the test never saw the progress lines'"
        ),
    ]
    nbformat.write(nb, folder / "jobs.ipynb")


@pytest.mark.slow
def test_rlq_run_prints_a_line_per_job_before_the_notebook_finishes(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    write_jobs_notebook(folder)
    out = tmp_path / "out"
    env = {**os.environ, "RLQ_NOTEBOOKS": str(folder)}
    env.pop(PROGRESS_FILE_ENV, None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlq.faces.cli", "run", "jobs", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 150
        while not any("[2/2] second: done" in line for line in lines) and time.monotonic() < deadline:
            assert proc.poll() is None, "".join(lines)
            time.sleep(0.1)
        assert any("[2/2] second: done" in line for line in lines), "".join(lines)
        run_dir = next((out / "jobs").iterdir())
        assert json.loads((run_dir / "results.json").read_text())["status"] == "running"  # still going
        (run_dir / "go").touch()
        stdout, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=5)
    assert proc.returncode == 0, "".join(lines)
    assert stdout.strip() == str(run_dir.resolve())
    job_lines = [line for line in lines if ": done in" in line]
    assert [line.split(":")[1].split("]")[-1].strip() for line in job_lines] == ["first", "second"]
    assert "[1/2] first: done in 00:00; 100 steps in 00:00" in job_lines[0]
    assert not any("Executing" in line for line in lines)  # no cell counter when stderr is no terminal
    assert len((run_dir / "progress.jsonl").read_text().splitlines()) == 9  # jobs, then 4 per job
