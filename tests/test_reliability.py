"""What a hostile user tries: bad values for every parameter of every notebook, bad --out folders, killed
runs, damaged state files. Bad input exits 2 before a kernel starts and leaves no run folder."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from conftest import REPO, run_cli
from rlq.core.jsonio import read_json
from rlq.experiments import runner
from rlq.experiments.constraints import Constraint, ConstraintError, check_value, parse_constraint
from rlq.experiments.registry import list_experiments
from rlq.experiments.run_folders import RESULTS_FILE, RUNNER_FILE, run_state
from rlq.faces.cli import main

EXPERIMENTS = list_experiments(REPO / "notebooks")


def _type_probes(param) -> list[tuple[str, str]]:
    """Return ``(why, text)`` pairs of the wrong type (or non-finite) for ``param``'s default and its items."""
    c: Constraint = param.constraint
    default = param.default
    bad: list[tuple[str, str]] = []
    if isinstance(default, bool):
        bad.append(("wrong type", "maybe"))
    elif isinstance(default, int):
        bad += [("wrong type", "x"), ("wrong type", "1.5")]
    elif isinstance(default, float):
        bad.append(("wrong type", "x"))
        if not c.nonfinite:
            bad += [("non-finite", "nan"), ("non-finite", "inf")]  # "-inf" argparse reads as an option
    elif isinstance(default, (list, dict)):
        bad.append(("wrong type", "5"))
    if isinstance(default, list):
        items = c.items or (type(default[0]) if default and len({type(v) for v in default}) == 1 else None)
        if items in (int, float):
            bad.append(("wrong item type", '["x"]'))
            if not c.nonfinite:
                bad.append(("non-finite", "[1e999]"))
        elif items is str:
            bad.append(("wrong item type", "[1]"))
    return bad


def _wrap(default):
    """Return how a probe's text is given for a parameter with ``default``: a list's holds one item."""
    return (lambda text: f"[{text}]") if isinstance(default, list) else (lambda text: text)


def _bound_probes(param) -> list[tuple[str, str]]:
    """Return ``(why, text)`` pairs just outside each of ``param``'s declared bounds."""
    c: Constraint = param.constraint
    default = param.default
    integer = isinstance(default, int) or (
        isinstance(default, list) and default and isinstance(default[0], int)
    )
    bad = []
    for key, delta in (("min", -1), ("gt", 0), ("max", 1), ("lt", 0)):
        bound = getattr(c, key)
        if bound is not None:
            value = bound + delta
            bad.append(
                (
                    f"out of range ({key}={bound:g})",
                    _wrap(default)(str(int(value)) if integer else str(value)),
                )
            )
    return bad


def _declared_probes(param) -> list[tuple[str, str]]:
    """Return ``(why, text)`` pairs that break ``param``'s declared uniqueness, choices or kind."""
    c: Constraint = param.constraint
    default = param.default
    wrap = _wrap(default)
    quoted = (lambda text: f'"{text}"') if isinstance(default, list) else (lambda text: text)
    bad: list[tuple[str, str]] = []
    if c.unique and isinstance(default, list) and default:
        bad.append(("repeated item", json.dumps([default[0], default[0]])))
    if c.choices:
        bad.append(("not a choice", wrap(quoted("no-such-choice"))))
    if c.kind == "env_id":
        bad.append(("unknown env id", wrap(quoted("NoSuchEnv-v9"))))
    if c.kind == "run":
        bad += [
            ("unknown algorithm in a run", '[["NOPE", "CartPole-v1", 100]]'),
            ("unknown env id in a run", '[["PPO", "NoSuchEnv-v9", 100]]'),
            ("no training steps in a run", '[["PPO", "CartPole-v1", 0]]'),
            ("a run without its steps", '[["PPO", "CartPole-v1"]]'),
        ]
    if c.kind == "algorithm":
        bad.append(("unknown algorithm", wrap(quoted("NOPE"))))
    return bad


def _bad_values(param) -> list[tuple[str, str]]:
    """Return ``(why, text)`` pairs that must be rejected for ``param``, from its default and constraint."""
    return _type_probes(param) + _bound_probes(param) + _declared_probes(param)


PROBES = [
    pytest.param(exp.name, p.name, why, text, id=f"{exp.name}-{p.name}-{why}-{text}")
    for exp in EXPERIMENTS
    for p in exp.parameters.values()
    for why, text in _bad_values(p)
]


@pytest.fixture
def no_kernel(monkeypatch):
    """Fail the test if anything would start a kernel."""

    def refuse(*args, **kwargs):
        raise AssertionError("a kernel was about to start for input that should have been rejected")

    monkeypatch.setattr(runner, "execute", refuse)


def test_every_notebook_has_probes():
    probed = {p.values[0] for p in PROBES}
    assert probed == {e.name for e in EXPERIMENTS}


@pytest.mark.parametrize(("name", "param", "why", "text"), PROBES)
def test_bad_value_exits_2_before_a_kernel_and_leaves_no_folder(
    name, param, why, text, tmp_path, capsys, no_kernel
):
    out = tmp_path / "runs"
    code = main(["run", name, "--preset", "quick", "-p", param, text, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, f"{why}: -p {param} {text} was accepted"
    assert param in err, f"the error does not name the parameter: {err}"
    assert not err.startswith("rlq: running"), err
    assert not out.exists() or not any(out.rglob("*")), "a run folder was created"


def test_declared_constraints_hold_for_every_default_and_preset():
    for exp in EXPERIMENTS:
        for preset in exp.presets:
            exp.resolve(preset)  # raises ExperimentError naming the parameter and the preset


def test_constraint_syntax():
    c = parse_constraint("bit widths swept [items: int, min: 2, max: 16, min_len: 1]", "here")
    assert (c.items, c.min, c.max, c.min_len) == (int, 2.0, 16.0, 1)
    check_value("bits", [2, 8, 16], [8], c)
    for bad in ([1], [17], [], [8, "x"], [8.5]):
        with pytest.raises(ConstraintError, match="bits"):
            check_value("bits", bad, [8], c)
    assert parse_constraint("no bracket here", "here") == Constraint()
    assert parse_constraint("a list [1, 2] mid-comment", "here") == Constraint()
    assert parse_constraint("x [choices: a|b c|d]", "here").choices == ("a", "b c", "d")
    with pytest.raises(ConstraintError, match="unknown constraint key"):
        parse_constraint("x [bogus: 1]", "here")
    with pytest.raises(ConstraintError, match="cannot read"):
        parse_constraint("x [min: abc]", "here")
    assert parse_constraint("x [nonfinite: ok]", "here").nonfinite
    assert parse_constraint("x [unique: yes]", "here").unique
    check_value("t", float("inf"), 1.0, parse_constraint("x [nonfinite: ok]", "here"))
    with pytest.raises(ConstraintError, match="finite"):
        check_value("t", float("nan"), 1.0, Constraint())
    with pytest.raises(ConstraintError, match="finite"):
        check_value("t", float("-inf"), 1.0, Constraint())
    # a list whose default holds ints only takes ints, declared or not
    with pytest.raises(ConstraintError, match="item 1"):
        check_value("bits", [8, "x"], [8, 6], Constraint())


def test_repeated_parameter_is_rejected(tiny_notebooks, tmp_path, capsys, no_kernel):
    code = main(["run", "tiny", "-p", "x", "1", "-p", "x", "2", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "'x'" in err and "more than once" in err
    assert not (tmp_path / "r").exists()


# ---- --out


def test_out_that_is_a_file_exits_2_with_one_line(tiny_notebooks, tmp_path):
    target = tmp_path / "a_file"
    target.write_text("not a folder")
    for out in (target, target / "below"):
        result = run_cli("run", "tiny", "--out", str(out), "--quiet")
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr and str(target) in lines[0], lines
    assert target.read_text() == "not a folder"


def test_read_only_out_exits_2(tiny_notebooks, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(ro)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        result = run_cli("run", "tiny", "--out", str(ro), "--quiet")
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
        assert "cannot create a run folder" in result.stderr
    finally:
        subprocess.run(["umount", str(ro)], check=False)


# ---- killed runs


def _write_notebook(path: Path, title: str, parameter: str, wall_time: str, *code: str) -> None:
    """Write a minimal experiment notebook: a title, one parameter, presets with ``wall_time``, then ``code``."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell(title),
        nbformat.v4.new_code_cell(parameter, metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(
            f'PRESETS = {{"quick": {{}}, "paper": {{}}}}\nPRESET_WALL_TIMES = {{"quick": "{wall_time}", "paper": "{wall_time}"}}',
            metadata={"tags": ["presets"]},
        ),
        *(nbformat.v4.new_code_cell(source) for source in code),
    ]
    nbformat.write(nb, path)


def _sleepy_notebook(folder: Path) -> None:
    _write_notebook(
        folder / "sleepy.ipynb", "# Sleepy: a run that takes a while", "seconds = 60.0  # how long to sleep [min: 0]",
        "1 min", "import time\nimport rlq\nrlq.record(started_sleeping=1)\ntime.sleep(seconds)",
    )  # fmt: skip


def _start_run(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _sleepy_notebook(folder)
    out = tmp_path / "runs"
    env = {**os.environ, "RLQ_NOTEBOOKS": str(folder)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlq.faces.cli", "run", "sleepy", "--out", str(out), "--quiet"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: the kernel dies with it under killpg
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        found = list(out.glob("sleepy/*/results.json"))
        if found and read_json(found[0]).get("started_sleeping") == 1:
            return proc, found[0].parent
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(
        f"the run never started: {proc.stderr.read().decode()[-2000:] if proc.poll() else ''}"
    )


@pytest.mark.slow
def test_killed_run_is_interrupted_not_running(tmp_path):
    """One run serves three checks (a kernel start costs 15-20 s): live, resume refused, killed."""
    proc, run_dir = _start_run(tmp_path)
    try:
        assert run_state(run_dir) == "running"
        assert read_json(run_dir / RUNNER_FILE)["pid"] == proc.pid
        env = {"RLQ_NOTEBOOKS": str(tmp_path / "notebooks")}
        refused = run_cli("run", "--resume", str(run_dir), env=env)
        assert refused.returncode == 2 and "still running" in refused.stderr
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert read_json(run_dir / RESULTS_FILE)["status"] == "running"  # nothing could write after SIGKILL
    assert run_state(run_dir) == "interrupted"
    listing = run_cli("runs", "--runs", str(tmp_path / "runs"))
    assert [line.split("  ")[1] for line in listing.stdout.splitlines()] == ["interrupted"]
    from rlq.faces.report import collect_runs

    records = [
        r for r in collect_runs(tmp_path / "runs", tmp_path / "no_results") if r.experiment == "sleepy"
    ]
    assert [r.status for r in records] == ["interrupted"]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_stop_a_run_like_ctrl_c(tmp_path, signum):
    proc, run_dir = _start_run(tmp_path)  # SIGHUP is what a closed terminal sends
    try:
        proc.send_signal(signum)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    results = read_json(run_dir / RESULTS_FILE)
    assert code == 130
    assert results["status"] == "interrupted" and "resume" in results["error"]
    assert run_state(run_dir) == "interrupted"
    # what the kernel prints as it is shut down goes to kernel.log: the terminal gets rlq's two lines only
    assert proc.stderr.read().decode().splitlines() == [
        "rlq: running sleepy (preset defaults)",
        "rlq: interrupted",
    ]
    assert "[IPKernelApp]" in (run_dir / "kernel.log").read_text()


# ---- kernels started side by side


def test_each_run_kernel_talks_over_socket_files_of_its_own_and_removes_them(tmp_path, monkeypatch):
    """Two kernels started at once by two processes cannot take the same TCP port: each has its own sockets."""
    import asyncio
    import tempfile

    from rlq.experiments.kernel_log import RunKernelManager

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    async def start_ask_and_stop() -> tuple[dict, list[str], str]:
        manager = RunKernelManager(kernel_name="python3")
        await manager.start_kernel()
        client = manager.client()
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=60)
            reply = await client.execute_interactive("print(6 * 7)", timeout=60, output_hook=outputs.append)
            sockets = sorted(p.name for p in Path(manager.ip).parent.iterdir())
        finally:
            client.stop_channels()
            await manager.shutdown_kernel(now=True)
        return manager.get_connection_info(), sockets, reply["content"]["status"]

    outputs: list[dict] = []
    info, sockets, status = asyncio.run(start_ask_and_stop())
    printed = [m["content"]["text"] for m in outputs if m["msg_type"] == "stream"]
    assert status == "ok" and printed == ["42\n"]
    folder = Path(info["ip"]).parent
    assert info["transport"] == "ipc" and folder.parent == tmp_path and folder.name.startswith("rlq-kernel-")
    ports = [info[f"{name}_port"] for name in ("shell", "iopub", "stdin", "control", "hb")]
    assert sockets == sorted(f"k-{port}" for port in ports)
    assert not folder.exists()  # removed with the kernel
    first, second = RunKernelManager(), RunKernelManager()
    assert first.ip != second.ip  # never the same path, whichever process makes them


def test_a_temporary_folder_too_long_for_a_socket_path_keeps_tcp(tmp_path, monkeypatch):
    import tempfile

    from rlq.experiments.kernel_log import MAX_SOCKET_PATH, RunKernelManager

    deep = tmp_path / ("d" * (MAX_SOCKET_PATH - len(str(tmp_path))))
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    manager = RunKernelManager()
    assert manager.transport == "tcp" and manager.ip == "127.0.0.1"
    assert list(deep.iterdir()) == []  # the unused folder is not left behind
    assert RunKernelManager(transport="tcp").transport == "tcp"  # an explicit choice is kept


# ---- damaged files


def test_damaged_json_names_the_file_and_what_to_do(tmp_path):
    path = tmp_path / "state_100_steps.json"
    path.write_text('{"steps": 10')
    with pytest.raises(ValueError, match="state_100_steps.json is damaged.*delete it"):
        read_json(path, what_to_do="delete it")
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="does not hold a JSON object"):
        read_json(path)


@pytest.mark.slow
def test_resuming_a_read_only_run_folder_exits_2_with_one_line_and_writes_nothing(tiny_notebooks, tmp_path):
    """Read-only by its mode bits, which root (whom no permission stops) is held to as well."""
    out = tmp_path / "runs"
    assert run_cli("run", "tiny", "-p", "fail", "true", "--out", str(out), "--quiet").returncode == 1
    run_dir = next((out / "tiny").iterdir())
    paths = [run_dir, *run_dir.rglob("*")]
    modes = {p: p.stat().st_mode for p in paths}
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in paths}
    for p in paths:
        p.chmod(modes[p] & ~0o222)
    try:
        result = run_cli("run", "--resume", str(run_dir))
        after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in [run_dir, *run_dir.rglob("*")]}
    finally:
        for p in paths:
            p.chmod(modes[p])
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"rlq: error: --resume {run_dir}: the run folder is read-only ({run_dir} is not writable); nothing was written"
    )
    assert after == before  # no lock, no archived attempt, no rewritten file


# ---- a full disk


def _filler_notebook(folder: Path) -> None:
    """A notebook that records a number, then writes until the disk is full, as a checkpoint save would."""
    _write_notebook(
        folder / "filler.ipynb", "# Filler: fills the disk mid-run", "megabytes = 64  # how much to write [min: 0]",
        "5 s", "import rlq\nrlq.record(started_training=1)",
        'with open("checkpoint.bin", "wb") as f:\n    for _ in range(megabytes):\n        f.write(b"0" * 2**20)\n'
        "        f.flush()",
    )  # fmt: skip


@pytest.fixture
def small_disk(tmp_path):
    """Return a 4 MiB tmpfs mounted for the test (root and mount needed, else the test is skipped)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.slow
def test_a_disk_filling_up_mid_run_leaves_it_failed_with_the_error(tmp_path, small_disk):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _filler_notebook(folder)
    result = run_cli("run", "filler", "--out", str(small_disk), "--quiet", env={"RLQ_NOTEBOOKS": str(folder)})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    (run_dir,) = (small_disk / "filler").iterdir()
    results = read_json(run_dir / RESULTS_FILE)
    assert results["status"] == "failed" and run_state(run_dir) == "failed"
    assert results["error"].startswith("OSError: [Errno 28] No space left on device")
    assert results["started_training"] == 1  # what the notebook recorded stays
    assert not (run_dir / runner.RESERVE_FILE).exists() and not list(run_dir.glob("*.tmp"))
    assert f"rlq: run failed: {results['error']}" in result.stderr


def test_a_disk_full_at_the_start_exits_2_with_one_line_and_leaves_no_run_folder(tiny_notebooks, small_disk):
    with open(small_disk / "filling", "wb") as f:
        with pytest.raises(OSError, match="No space left"):
            while True:
                f.write(b"0" * 2**16)
                f.flush()
    result = run_cli("run", "tiny", "--out", str(small_disk / "runs"), "--quiet")
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert (
        "cannot write the run folder (No space left on device); nothing ran, and the folder was removed"
        in last
    )
    assert "Traceback" not in result.stderr and not list((small_disk / "runs").rglob("*"))


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_simulated_full_disk_mid_run_is_recorded_in_the_space_the_run_held(
    tiny_notebooks, tmp_path, monkeypatch, capsys
):
    """Without a mount: the kernel fails on a full disk, after which results.json can be written only in the
    space the run reserved at its start; where not even that is there, the run's end is printed instead."""
    import papermill

    from rlq.core import jsonio
    from rlq.experiments.registry import get_experiment

    disk, real_write = {"full": False, "reserve helps": True}, jsonio.write_json

    def write_json(path, data):
        reserved = (Path(path).parent / runner.RESERVE_FILE).exists()
        if disk["full"] and (reserved or not disk["reserve helps"]):
            _enospc()
        real_write(path, data)

    def kernel_fills_the_disk(*args, **kwargs):
        disk["full"] = True
        _enospc()

    monkeypatch.setattr(runner, "write_json", write_json)
    monkeypatch.setattr(papermill, "execute_notebook", kernel_fills_the_disk)
    tiny = get_experiment("tiny")
    for helps in (True, False):
        disk.update({"full": False, "reserve helps": helps})
        folder = tmp_path / str(helps)
        folder.mkdir()
        outcome = runner.execute(tiny, tiny.resolve(), folder, progress=False)
        assert outcome.status == "failed" and outcome.results["error"].startswith(
            "OSError: [Errno 28] No space"
        )
        assert not (folder / runner.RESERVE_FILE).exists()
    assert read_json(tmp_path / "True" / RESULTS_FILE)["error"] == outcome.results["error"]
    assert (
        read_json(tmp_path / "False" / RESULTS_FILE)["status"] == "running"
    )  # no space at all: it could not
    assert capsys.readouterr().err.strip() == (
        f"rlq: cannot record the run's end in {(tmp_path / 'False').resolve() / RESULTS_FILE}: No space left on device"
    )


def test_a_simulated_full_disk_at_the_start_exits_2_and_leaves_no_run_folder(
    tiny_notebooks, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(os, "posix_fallocate", _enospc)  # the first write of a run: the space it holds
    out = tmp_path / "runs"
    assert main(["run", "tiny", "--out", str(out), "--quiet"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"rlq: error: {out.resolve() / 'tiny'}/") and last.endswith(
        ": cannot write the run folder (No space left on device); nothing ran, and the folder was removed"
    )
    assert not list(out.rglob("*"))
