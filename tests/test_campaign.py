"""``rlq campaign`` on tiny jobs: deadlines, a kill mid-job, a job from another commit, resume, status.

Each test makes a small git checkout holding a two-claim design and, as its registered code, a stand-in
``rlq/faces/cli.py`` whose ``run`` writes a finished run folder after ``RLQ_FAKE_SECONDS``: the campaign
runs the registered commit's own ``python -m rlq.faces.cli``, so the stand-in is what its jobs execute.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rlq.claims import campaign as cp
from rlq.claims.campaign_jobs import registered_jobs
from rlq.claims.design import SPEC_FILE, read_design
from rlq.core.jsonio import read_json, write_json

REAL_SPEC = Path(__file__).resolve().parents[1] / "data" / SPEC_FILE
FAKE_CLI = """
import json, os, sys, time, pathlib
args = sys.argv[1:]
assert args[0] == "run", args
if args[1] == "--resume":
    out = pathlib.Path(args[2]); params = json.loads((out / "params.json").read_text())
else:
    params = {args[i + 1]: json.loads(args[i + 2]) for i, a in enumerate(args) if a == "-p"}
    out = pathlib.Path(args[args.index("--out") + 1]) / args[1] / f"run-{os.getpid()}"
    out.mkdir(parents=True)
    (out / "params.json").write_text(json.dumps(params))
(out / "results.json").write_text(json.dumps({"status": "failed"}))
time.sleep(float(os.environ.get("RLQ_FAKE_SECONDS", "0.5")))
seed, method = params["seeds"][0], params["methods"][0]
value = 80.0 + (seed - 1000) * 0.5 if method == "gst" else 50.0
(out / "summary.csv").write_text(f"env_id,seed,method,avg_compression_ratio,covered_fraction\\nE,{seed},{method},{value},1.0\\n")
(out / "results.json").write_text(json.dumps({"status": "ok", "experiment": "gst_td3_mujoco", "run_seconds": 1.0}))
"""


def design_rows(minutes: tuple[float, float]) -> str:
    """Return a two-claim design: GST's compression (priority 1) and a second claim on dense (priority 2)."""
    header = REAL_SPEC.read_text().splitlines()[0]
    names = header.split(",")

    def row(**values) -> str:
        base = dict.fromkeys(names, "")
        base.update(experiment="gst_td3_mujoco", preset="long", published_as="confirmatory_long", table="summary.csv",
                    pair="seed", by="method", column="avg_compression_ratio/covered_fraction", statistic="t_mean",
                    scale="1", unit="%", direction=">=", threshold="60", seeds="5", design_sd="1",
                    design_distance="5", family="GST compression", paper_claim="x")  # fmt: skip
        base.update(values)
        return ",".join(str(base[n]) for n in names)

    return "\n".join([
        header,
        row(id="fast", label="fast", method="gst", arms="gst:5", priority=1, job_minutes=minutes[0]),
        row(id="slow", label="slow", method="dense", arms="dense:5", priority=2, job_minutes=minutes[1]),
    ]) + "\n"  # fmt: skip


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path):
    """Return a function that makes a committed checkout with a design of the given job minutes."""

    def make(minutes: tuple[float, float] = (0.01, 0.01)) -> Path:
        root = tmp_path / "repo"
        (root / "data" / "results").mkdir(parents=True)
        (root / "notebooks").mkdir()
        (root / "rlq" / "faces").mkdir(parents=True)
        (root / "rlq" / "__init__.py").write_text("")
        (root / "rlq" / "faces" / "__init__.py").write_text("")
        (root / "rlq" / "faces" / "cli.py").write_text(FAKE_CLI)
        (root / "data" / SPEC_FILE).write_text(design_rows(minutes))
        (root / ".gitignore").write_text("runs/\n")
        git(root, "init", "-q")
        git(root, "add", "-A")
        git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "register")
        return root

    return make


def campaign(root: Path, hours: float, workers: int = 2) -> tuple[int, list[str]]:
    said: list[str] = []
    return cp.run_campaign(hours, workers, root=root, say=said.append, poll=0.1), said


def published(root: Path) -> pd.DataFrame:
    path = root / "data" / "results" / "gst_td3_mujoco" / "confirmatory_long" / "summary.csv"
    return pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=["method", "seed"])


def test_a_deadline_leaves_the_jobs_that_would_end_after_it_unstarted(checkout):
    root = checkout((0.01, 30.0))  # GST's jobs take under a second; dense's are expected to take 30 minutes
    count, said = campaign(root, hours=0.05)  # 3 minutes
    table = published(root)
    assert count == 5 and sorted(table.seed) == [1000, 1001, 1002, 1003, 1004]
    assert set(table.method) == {"gst"} and not any("dense" in line for line in said)
    state = cp.campaign_state(root)
    assert [j.arm for j in state.remaining()] == ["dense"] * 5
    record = read_json(root / "data" / "results" / "gst_td3_mujoco" / "confirmatory_long" / "results.json")
    assert record["registered_commit"] == git(root, "rev-parse", "HEAD")
    assert {j["commit"] for j in record["jobs"]} == {record["registered_commit"]}


def test_a_campaign_with_every_job_published_says_so_and_starts_nothing(checkout):
    root = checkout()
    count, said = campaign(root, hours=0.05)
    assert count == 10 and len(published(root)) == 10
    done = "every registered job is published: nothing left to run (`rlq campaign status` gives the verdicts)"
    assert said[-1] == done
    again, said = campaign(root, hours=0.05)
    assert again == 0 and said == [done] and len(published(root)) == 10


def test_each_job_trains_under_the_registered_commit_in_its_own_worktree(checkout):
    root = checkout()
    campaign(root, hours=0.05)
    commit = git(root, "rev-parse", "HEAD")
    tree = root / "runs" / "campaign" / f"code-{commit[:12]}"
    assert git(tree, "rev-parse", "HEAD") == commit
    job = read_json(
        root / "runs" / "campaign" / "gst_td3_mujoco" / "confirmatory_long" / "gst-1000" / "job.json"
    )
    assert job["commit"] == commit and job["command"][-3] == "--out"
    outcomes = cp.claim_outcomes(cp.campaign_state(root), cp.results_root(root))
    assert outcomes["fast"].outcome == "holds"  # 80-82 against 60, 5 seeds


def register_again(root: Path, old: str, new: str) -> str:
    """Change the 'slow' claim's row (``old`` to ``new``), commit it and return the commit."""
    spec = root / "data" / SPEC_FILE
    lines = spec.read_text().splitlines()
    lines[2] = lines[2].replace(old, new)
    spec.write_text("\n".join(lines) + "\n")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "register slow again")
    return git(root, "rev-parse", "HEAD")


def test_a_claim_registered_again_trains_its_jobs_under_its_own_commit(checkout):
    from rlq.faces.report_confirmatory import registration

    root = checkout()
    first = git(root, "rev-parse", "HEAD")
    second = register_again(root, "confirmatory_long", "confirmatory_long_2")  # a new version of one claim
    assert cp.claim_commits(root) == {"fast": first, "slow": second}  # the other keeps its registration
    count, _ = campaign(root, hours=0.05)
    results = root / "data" / "results" / "gst_td3_mujoco"
    fast = read_json(results / "confirmatory_long" / "results.json")
    slow = read_json(results / "confirmatory_long_2" / "results.json")
    assert count == 10 and len(fast["jobs"]) == len(slow["jobs"]) == 5
    assert {j["commit"] for j in fast["jobs"]} == {first} and {j["commit"] for j in slow["jobs"]} == {second}
    for commit in (first, second):
        assert git(root / "runs" / "campaign" / f"code-{commit[:12]}", "rev-parse", "HEAD") == commit
    said = registration(root)
    assert f"`{first[:7]}`" in said and f"gst_td3_mujoco/confirmatory_long_2: `{second[:7]}`" in said


def test_claims_sharing_jobs_registered_by_two_commits_are_refused(checkout):
    root = checkout()
    register_again(root, ",60,", ",61,")  # the 'slow' claim's threshold: its jobs share a folder with 'fast'
    with pytest.raises(cp.CampaignError, match="were registered by 2 commits"):
        campaign(root, hours=0.05)
    assert not (root / "runs" / "campaign" / "gst_td3_mujoco").exists()


def test_a_jobs_kernel_imports_the_registered_rlq_not_the_editable_install(tmp_path):
    tree = tmp_path / "code-registered"
    (tree / "rlq").mkdir(parents=True)
    (tree / "rlq" / "__init__.py").write_text("REGISTERED = True\n")
    kernel_cwd = tmp_path / "run-folder"  # a notebook kernel runs in its run folder, not in the worktree
    kernel_cwd.mkdir()
    env = cp.job_environment(tree)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tree)
    probe = "import rlq; print(rlq.__file__, getattr(rlq, 'REGISTERED', False))"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=kernel_cwd, env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == [str(tree / "rlq" / "__init__.py"), "True"]


@pytest.mark.slow
def test_a_kill_mid_job_keeps_the_published_jobs_and_nothing_of_the_one_in_flight(checkout):
    root = checkout()
    env = {
        **os.environ,
        "RLQ_HOME": str(root),
        "RLQ_FAKE_SECONDS": "3",
        "PYTHONPATH": str(Path(cp.__file__).parents[2]),
    }
    command = [sys.executable, "-m", "rlq.faces.cli", "campaign", "run", "--hours", "1", "--workers", "1"]
    process = subprocess.Popen(command, env=env, cwd=root.parent, stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while len(published(root)) < 2 and time.time() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    table = published(root)
    assert sorted(table.seed)[:2] == [1000, 1001] and len(table) in (2, 3)
    record = read_json(root / "data" / "results" / "gst_td3_mujoco" / "confirmatory_long" / "results.json")
    assert len(record["jobs"]) == len(table)  # the tables and the job list agree: no half-published job
    assert not list(
        (root / "data" / "results" / "gst_td3_mujoco").glob(".*")
    )  # no staging folder left behind


def first_job_run(root: Path, name: str, results: dict, params: dict) -> tuple[Any, Path, Path]:
    """Make a run folder ``name`` with these ``results.json`` and ``params.json`` in the design's first job's
    folder; return the job, its folder and the run folder."""
    job = registered_jobs(read_design(root / "data" / SPEC_FILE))[0]
    folder = cp.job_dir(root, job)
    run = folder / "gst_td3_mujoco" / name
    run.mkdir(parents=True)
    write_json(run / "results.json", results)
    write_json(run / "params.json", params)
    return job, folder, run


def test_a_job_trained_under_another_commit_is_refused(checkout):
    root = checkout()
    job, folder, run = first_job_run(root, "run-1", {"status": "ok", "experiment": "gst_td3_mujoco"}, {})
    (run / "summary.csv").write_text(
        "env_id,seed,method,avg_compression_ratio,covered_fraction\nE,1000,gst,1,1\n"
    )
    write_json(
        folder / cp.JOB_FILE, {**{k: getattr(job, k) for k in job.__dataclass_fields__}, "commit": "0" * 40}
    )
    commit = git(root, "rev-parse", "HEAD")
    with pytest.raises(cp.CampaignError, match="trained under commit 000000000000, not the registered"):
        cp.publish_job(folder, commit, cp.results_root(root))
    assert published(root).empty


def test_a_shallow_clone_is_refused(checkout, tmp_path):
    root = checkout()
    with open(root / "notebooks" / "x", "w") as handle:
        handle.write("x")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "later")
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{root}", str(shallow)], check=True)
    with pytest.raises(cp.CampaignError, match="shallow clone"):
        cp.registered_commit(shallow)


def test_an_uncommitted_change_to_the_design_is_refused(checkout):
    root = checkout()
    with open(root / "data" / SPEC_FILE, "a") as handle:
        handle.write("\n")
    with pytest.raises(cp.CampaignError, match="uncommitted changes"):
        cp.registered_commit(root)


def test_a_job_cut_off_resumes_its_run_folder(checkout):
    root = checkout()
    _, folder, run = first_job_run(
        root, "run-cut", {"status": "interrupted"}, {"methods": ["gst"], "seeds": [1000]}
    )
    campaign(root, hours=0.05)
    record = read_json(folder / cp.JOB_FILE)
    assert record["command"][3:5] == ["run", "--resume"] and record["command"][5] == str(run)
    assert 1000 in set(published(root).seed)


def test_a_running_jobs_progress_is_its_newest_training_event(checkout):
    root = checkout()
    job, _, run = first_job_run(root, "run-live", {"status": "running"}, {})
    assert cp.job_progress(root, job) == ""  # no event yet
    events = [
        {"event": "train", "steps": 1000, "total": 150000, "sps": 50.0},
        {"event": "eval", "steps": 2000},
        {"event": "train", "steps": 53186, "total": 150000, "sps": 19.6},
    ]
    (run / "progress.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + '{"event": "tr')
    assert cp.job_progress(root, job) == "53,186 of 150,000 steps, 20 steps/s"


def test_the_real_design_status_lists_every_claim(capsys):
    from rlq.faces.cli import main

    assert main(["campaign", "status", "--next", "2"]) == 0
    out = capsys.readouterr().out
    for claim in read_design():
        assert claim.id in out
    left, stopped = cp.jobs_left(cp.campaign_state())
    assert "jobs published" in out and out.count("next: ") == min(2, len(left))
    assert (f"{len(stopped)} stopped by their claims' floor rule" in out) == bool(stopped)


@pytest.mark.parametrize(("goals", "gated"), [(0.5, False), (0.05, True)])
def test_a_pilot_is_judged_on_its_score_for_every_claim_it_gates(tmp_path, goals, gated):
    """Football's dense pilot scores goals; its compression, 0 for dense, must not count as its score."""
    claims = read_design()
    state = cp.CampaignState(claims, registered_jobs(claims), set())
    compression = next(c for c in claims if c.id == "gst_football_compression")
    folder = cp.published_dir(compression, tmp_path)
    folder.mkdir(parents=True)
    arm, seed = compression.pilot
    pd.DataFrame([{"seed": seed, "method": arm, "avg_compression_ratio": 0.0, "eval_return": goals,
                   "campaign_arm": arm, "campaign_seed": seed}]).to_csv(folder / "summary.csv", index=False)  # fmt: skip
    outcomes = cp.claim_outcomes(state, tmp_path)
    expected = "uninformative (floor)" if gated else "runs remaining"
    assert outcomes["gst_football_compression"].outcome == expected
    assert outcomes["gst_football_reward"].outcome == expected
    football = [j for j in state.jobs if j.experiment == compression.experiment and not j.pilot]
    assert len(football) == 16
    assert all(cp.blocked_by_pilot(j, state, tmp_path) == gated for j in football)
    left, stopped = cp.jobs_left(state, tmp_path)  # a floor stops the jobs for good: none is left to run
    assert stopped == (football if gated else []) and not set(map(id, stopped)) & set(map(id, left))
    assert len(left) + len(stopped) == len(state.jobs)
    if gated:
        assert (
            f"the dense pilot (seed {seed}) scored 0.05 < 0.2" in outcomes["gst_football_compression"].reason
        )


def test_a_pilot_whose_arm_no_claim_measures_is_refused(tmp_path):
    lines = REAL_SPEC.read_text().splitlines()
    design = tmp_path / SPEC_FILE
    design.write_text("\n".join(line.replace("dense:901", "pruning:901") for line in lines) + "\n")
    with pytest.raises(
        ValueError,
        match="no claim on gst_ppo_football/confirmatory_medium_2 measures the pilot's arm 'pruning'",
    ):
        read_design(design)


def test_job_commands_pass_each_override_as_json():
    job = registered_jobs(read_design())[0]
    command = cp.job_command(job, Path("/tmp/x"), address="ray://h:1")
    overrides = {command[i + 1]: json.loads(command[i + 2]) for i, a in enumerate(command) if a == "-p"}
    assert overrides["seeds"] == [job.seed] and overrides["workers"] == 1
    assert overrides["executor"] == "ray" and overrides["ray_address"] == "ray://h:1"


def test_the_readme_table_is_what_the_design_and_the_published_runs_say():
    root = Path(__file__).resolve().parents[1]
    if git(root, "rev-parse", "--is-shallow-repository") == "true":
        pytest.skip("a shallow clone cannot tell which commit registered the design")
    sys.path.insert(0, str(root / "tools"))
    import readme_claims

    assert readme_claims.render(readme_claims.README.read_text()) == readme_claims.README.read_text(), (
        "README.md's confirmatory table is out of date: run python tools/readme_claims.py"
    )


def test_a_published_confirmatory_folder_stays_out_of_the_exploratory_report(tmp_path):
    from rlq.faces.report import collect_runs
    from rlq.faces.static_figures import committed_runs

    for name, confirmatory in (("confirmatory_long", True), ("long", False)):
        folder = tmp_path / "results" / "gst_td3_mujoco" / name
        folder.mkdir(parents=True)
        write_json(folder / "results.json", {"status": "ok", "confirmatory": confirmatory})
        write_json(folder / "params.json", {})
    runs = tmp_path / "runs"
    runs.mkdir()
    assert [r.preset for r in collect_runs(runs, tmp_path / "results")] == ["long"]
    assert [c.preset for c in committed_runs(tmp_path / "results")] == ["long"]


def test_a_jobs_expected_time_is_the_longest_on_this_kind_of_cpu_else_on_any(tmp_path):
    job = next(j for j in registered_jobs(read_design(REAL_SPEC)) if j.arm == "dense")
    folder = cp.published_dir(job, tmp_path)
    folder.mkdir(parents=True)

    def entry(arm: str, minutes: float, cpu: str | None = None) -> dict[str, Any]:
        return {"arm": arm, "seed": 1, "wall_time_s": 60.0 * minutes, **({"cpu": cpu} if cpu else {})}

    assert (
        cp.expected_minutes(job, tmp_path, cpu="A") == job.minutes
    )  # nothing published: the registered minutes
    jobs = [entry("dense", 139.0), entry("gst", 400.0, "A")]  # the first timed before CPUs were recorded
    write_json(folder / "results.json", {"jobs": jobs})
    assert cp.expected_minutes(job, tmp_path, cpu="A") == 139.0  # no dense job timed on A: the longest on any
    write_json(
        folder / "results.json", {"jobs": [*jobs, entry("dense", 34.0, "A"), entry("dense", 40.0, "A")]}
    )
    assert cp.expected_minutes(job, tmp_path, cpu="A") == 40.0
    assert cp.expected_minutes(job, tmp_path, cpu="B") == 139.0
    gst = next(j for j in registered_jobs(read_design(REAL_SPEC)) if j.arm == "gst")
    assert cp.published_dir(gst, tmp_path) == folder
    write_json(
        folder / "results.json",
        {
            "jobs": [
                entry("dense", 139.0),
                entry("dense", 40.0, "A"),
                entry("gst", 152.0),
                entry("gst", 100.0, "B"),
            ]
        },
    )
    assert cp.expected_minutes(gst, tmp_path, cpu="A") == pytest.approx(
        152.0 * 40.0 / 139.0
    )  # dense's speed on A
    assert cp.expected_minutes(gst, tmp_path, cpu="B") == 100.0
    assert cp.expected_minutes(job, tmp_path, cpu="C") == 139.0  # no arm timed on C: nothing to scale by
    assert (
        cp.expected_minutes(job, tmp_path, cpu=cp.ANY_CPU) == 139.0
    )  # what the README counts, on any machine


def test_a_published_table_appends_rows_with_empty_columns_without_pandas_warnings():
    import warnings

    table = pd.DataFrame({"seed": [1, 2], "note": [float("nan")] * 2, "ret": [1.5, 2.5]})
    rows = pd.DataFrame({"seed": [3], "ret": [4.0], "note": ["late"], "extra": [float("nan")]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        merged = cp._appended(table, rows)
        assert cp._appended(table, rows.iloc[:0]).equals(table.reindex(columns=merged.columns))
    assert list(merged.columns) == ["seed", "note", "ret", "extra"]
    assert merged["seed"].tolist() == [1, 2, 3] and merged["ret"].tolist() == [1.5, 2.5, 4.0]
    assert merged["note"].isna().tolist() == [True, True, False] and merged["note"].iloc[2] == "late"
    assert merged["extra"].isna().all() and merged["seed"].dtype.kind == "i"


def test_every_outcome_of_a_claim_has_its_verdict_cell():
    from rlq.faces.report_confirmatory import _verdict

    claims = {c.id: c for c in read_design()}
    joint, reward = claims["gst_td3_joint"], claims["gst_td3_reward"]
    assert joint.power() is None  # a joint claim has no power of its own: its parts' outcomes are shown
    assert (
        _verdict(joint, "inconclusive", "holds; inconclusive")
        == "**inconclusive** (its parts: holds; inconclusive)"
    )
    assert _verdict(reward, "inconclusive", "") == f"**inconclusive** (registered power {reward.power():.2f})"
    assert _verdict(joint, "holds", "holds; holds") == "**holds**"
    assert (
        _verdict(joint, "does not hold", "holds; does not hold")
        == "**does not hold** (its parts: holds; does not hold)"
    )
    football = claims["gst_football_joint"]  # a by-design part and an undecided one: the cell names both
    assert (
        _verdict(football, "by design", "by design; inconclusive")
        == "by design (its parts: by design; inconclusive)"
    )
    assert _verdict(football, "runs remaining", "runs remaining; runs remaining") == "runs remaining"
