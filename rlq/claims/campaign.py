"""``rlq campaign``: run the registered confirmatory design job by job, and publish each job as it finishes.

Each claim of the design (:mod:`rlq.claims.design`) is registered by the commit that last changed its row
of ``data/claims_confirmatory.csv`` (:func:`claim_commits`: a later commit that registers a new version of
some claims leaves the others' registration as it was); every job trains under its claims' commit, in a git
worktree of it (``runs/campaign/code-<commit>``), through ``rlq run`` with the registered preset and the
job's own arm and seed (:func:`rlq.claims.campaign_jobs.job_overrides`). A job's folder is
``runs/campaign/<experiment>/<published_as>/<arm>-<seed>/``: ``job.json`` (the job and its commit) and the
run folder ``rlq run`` makes inside it.

A finished job is published at once into ``data/results/<experiment>/<published_as>/``: its tables are
merged by seed into the published ones (each row tagged with ``campaign_arm`` and ``campaign_seed``) and
``results.json`` lists every published job with its commit and wall time. The folder is written beside the
published one and swapped in (:func:`rlq.experiments.results.replace_folder`), so a kill at any moment leaves
the jobs published before it and nothing of the job in flight. A job trained under another commit is refused.

:func:`run_campaign` starts jobs in priority order, only those whose expected duration (the longest a
published job of the same experiment, preset and arm took on this kind of CPU, else on any, else the
registered ``job_minutes``) ends before the deadline; a job whose folder holds an unfinished run resumes it (``rlq run --resume``).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from rlq.claims.campaign_jobs import Job, job_overrides, registered_jobs
from rlq.claims.design import SPEC_FILE, RegisteredClaim, judge, judge_joint, pilot_gate, read_design
from rlq.core.cpu import cpu_model
from rlq.core.jsonio import read_json, write_json
from rlq.core.progress import PROGRESS_FILE, ProgressReader
from rlq.experiments.paths import data_dir, repo_root
from rlq.experiments.results import recover_folder, replace_folder
from rlq.experiments.run_folders import RESULTS_FILE, run_state

log = logging.getLogger(__name__)
JOB_FILE = "job.json"
RAY_EXPERIMENTS = ("gst_td3_mujoco", "gst_a2c_atari", "gst_ppo_football", "quarl_ptq", "quarl_qat")
"""The experiments whose notebooks send their training to a Ray cluster (``executor``, ``ray_address``)."""
TAGS = ("campaign_arm", "campaign_seed")


class CampaignError(ValueError):
    """A campaign step that cannot be done: no registration, a job from another commit, a broken job."""


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CampaignError(
            f"git {' '.join(args)} failed in {root}: {done.stderr.strip() or done.stdout.strip()}"
        )
    return done.stdout.strip()


def registered_commit(root: Path | None = None) -> str:
    """Return the commit that registered the design: the last commit that changed its specification file.

    Refuses a checkout whose specification differs from that commit's (an edit not yet committed would
    otherwise judge runs by a design no commit registered).
    """
    root = root or repo_root()
    spec = f"data/{SPEC_FILE}"
    if _git(root, "rev-parse", "--is-shallow-repository") == "true":
        raise CampaignError(f"{root} is a shallow clone, which cannot tell which commit registered {spec}: "
                            "git fetch --unshallow")  # fmt: skip
    commit = _git(root, "log", "-n", "1", "--format=%H", "--", spec)
    if not commit:
        raise CampaignError(f"{spec} was never committed: commit the design before its runs")
    if _git(root, "status", "--porcelain", "--", spec):
        raise CampaignError(f"{spec} has uncommitted changes: commit them (a new registration) or undo them")
    return commit


def _rows_at(root: Path, commit: str) -> dict[str, tuple[str, ...]]:
    """Return the design's rows at ``commit``, by claim id, each as its cells."""
    text = _git(root, "show", f"{commit}:data/{SPEC_FILE}")
    rows = csv.reader(io.StringIO(text))
    next(rows, None)
    return {row[0]: tuple(row) for row in rows if row}


def spec_history(root: Path) -> list[str]:
    """Return the commits that changed the design's specification file, newest first."""
    return _git(root, "log", "--format=%H", "--", f"data/{SPEC_FILE}").split()


def claim_commits(root: Path | None = None) -> dict[str, str]:
    """Return, for each claim of the design, the commit that registered it: the last that changed its row.

    A claim's row left as it was keeps the commit that registered it when a later commit registers other
    rows (a new version of one claim, its runs all to come); its jobs train under its own commit.
    """
    root = root or repo_root()
    newest = registered_commit(root)
    history = spec_history(root)
    current = _rows_at(root, newest)
    commits = dict.fromkeys(current, newest)
    unchanged = set(current)
    for commit in history[1:]:
        rows = _rows_at(root, commit)
        unchanged = {i for i in unchanged if rows.get(i) == current[i]}
        for claim_id in unchanged:
            commits[claim_id] = commit
        if not unchanged:
            break
    return commits


def job_commits(state: CampaignState, commits: dict[str, str]) -> dict[tuple[str, str, str, int], str]:
    """Return the commit each job trains under: its claims' (the claims published where it is published).

    Raises CampaignError when those claims were registered by different commits (their shared jobs could
    not train under both).
    """
    out: dict[tuple[str, str, str, int], str] = {}
    for job in state.jobs:
        mine = {
            commits[c.id] for c in state.claims if c.runs and (c.experiment, c.published_as) == job.key[:2]
        }
        if len(mine) != 1:
            raise CampaignError(
                f"the claims published in {job.experiment}/{job.published_as} were registered by "
                f"{len(mine)} commits ({', '.join(sorted(c[:12] for c in mine))}): register them together"
            )
        out[job.key] = mine.pop()
    return out


def ensure_worktree(root: Path, commit: str) -> Path:
    """Return a git worktree of ``commit`` under ``runs/campaign/``, made (and its C kernels built) once."""
    tree = root / "runs" / "campaign" / f"code-{commit[:12]}"
    if not (tree / ".git").exists():
        tree.parent.mkdir(parents=True, exist_ok=True)
        _git(root, "worktree", "add", "--detach", str(tree), commit)
        subprocess.run(
            [sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tree, capture_output=True, check=False
        )
    if _git(tree, "rev-parse", "HEAD") != commit:
        raise CampaignError(f"{tree} is not at the registered commit {commit[:12]}")
    return tree


def job_dir(root: Path, job: Job) -> Path:
    """Return the folder of ``job``'s runs under ``runs/campaign/``."""
    return root / "runs" / "campaign" / job.experiment / job.published_as / job.name


def job_command(job: Job, out: Path, address: str = "") -> list[str]:
    """Return the ``rlq run`` command that trains ``job`` into a run folder under ``out`` (as a Ray task on the
    cluster at ``address`` when one is given and the notebook trains through ``executor``; ActorQ's
    convergence runs stay on this machine)."""
    command = [sys.executable, "-m", "rlq.faces.cli", "run", job.experiment, "--preset", job.preset]
    overrides = job_overrides(job.experiment, job.arm, job.seed)
    if address and job.experiment in RAY_EXPERIMENTS:
        overrides |= {"executor": "ray", "ray_address": address}
    for name, value in overrides.items():
        command += ["-p", name, json.dumps(value)]
    return [*command, "--out", str(out), "--quiet"]


def run_folder(folder: Path) -> Path | None:
    """Return the newest run folder ``rlq run`` made under a job's folder, or None."""
    found = sorted(p.parent for p in folder.glob(f"*/*/{RESULTS_FILE}"))
    return found[-1] if found else None


def running_elsewhere(root: Path, job: Job) -> bool:
    """Return True when ``job``'s folder holds a live run that this process did not start (an earlier call's)."""
    run = run_folder(job_dir(root, job))
    return run is not None and run_state(run, read_json(run / RESULTS_FILE)) == "running"


def job_environment(tree: Path) -> dict[str, str]:
    """Return the environment a job runs in: the registered worktree first on ``PYTHONPATH``, so that the
    notebook's kernel (whose working directory is the run folder) imports the registered ``rlq`` and not the
    editable install of the checkout that runs the campaign."""
    env = {k: v for k, v in os.environ.items() if k not in ("RLQ_HOME", "RLQ_NOTEBOOKS", "PYTHONPATH")}
    inherited = os.environ.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *([inherited] if inherited else [])])
    return env


def job_progress(root: Path, job: Job) -> str:
    """Return where a running job's training stands, from its run folder's progress events ("" before any)."""
    run = run_folder(job_dir(root, job))
    events = ProgressReader(run / PROGRESS_FILE, from_end=False).read() if run is not None else []
    trained = [e for e in events if e.get("event") == "train" and e.get("total")]
    if not trained:
        return ""
    last = trained[-1]
    return (
        f"{int(last['steps']):,} of {int(last['total']):,} steps, {float(last.get('sps', 0.0)):.0f} steps/s"
    )


def launch(job: Job, root: Path, tree: Path, commit: str, address: str = "") -> subprocess.Popen:
    """Start ``job`` under the registered worktree (resuming its unfinished run folder if it has one)."""
    folder = job_dir(root, job)
    folder.mkdir(parents=True, exist_ok=True)
    existing = run_folder(folder)
    if existing is not None and run_state(existing, read_json(existing / RESULTS_FILE)) != "ok":
        command = [sys.executable, "-m", "rlq.faces.cli", "run", "--resume", str(existing), "--quiet"]
    else:
        command = job_command(job, folder, address)
    write_json(
        folder / JOB_FILE, {**asdict(job), "commit": commit, "started": time.time(), "command": command}
    )
    env = job_environment(tree)
    log_file = open(folder / "job.log", "a")  # noqa: SIM115 - the child process writes it
    return subprocess.Popen(command, cwd=tree, env=env, stdout=log_file, stderr=subprocess.STDOUT)


def published_dir(job: Job | RegisteredClaim, results: Path | None = None) -> Path:
    """Return the published folder of a job's or claim's confirmatory runs."""
    return (results or data_dir() / "results") / job.experiment / job.published_as


def published_jobs(folder: Path) -> list[dict[str, Any]]:
    """Return the job records a published confirmatory folder lists (none when it does not exist)."""
    path = folder / RESULTS_FILE
    return list(read_json(path).get("jobs", [])) if path.is_file() else []


def _appended(table: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """Return ``rows`` below ``table``, columns in order of first appearance; a column empty in one of them
    takes its dtype from the other (pandas' concat is deprecating that rule, so empty columns are left out
    of the concat and restored by the reindex)."""
    columns = list(dict.fromkeys([*table.columns, *rows.columns]))
    parts = [part.dropna(axis=1, how="all") for part in (table, rows) if len(part)]
    return (
        pd.concat(parts, ignore_index=True).reindex(columns=columns)
        if parts
        else table.reindex(columns=columns)
    )


def _merged_tables(target: Path, run: Path, job: Job) -> dict[str, pd.DataFrame]:
    tables = {}
    for path in sorted(run.glob("*.csv")):
        new = pd.read_csv(path).assign(campaign_arm=job.arm, campaign_seed=job.seed)
        old = target / path.name
        tables[path.name] = _appended(pd.read_csv(old), new) if old.is_file() else new
    return tables


def publish_job(folder: Path, commit: str, results: Path | None = None) -> Path:
    """Merge the finished job in ``folder`` into its published folder; return that folder.

    Refuses a job trained under another commit than ``commit``, one not finished, and one already published.
    """
    record = read_json(folder / JOB_FILE)
    job = Job(**{k: record[k] for k in Job.__dataclass_fields__})
    if record.get("commit") != commit:
        raise CampaignError(
            f"{folder}: trained under commit {str(record.get('commit'))[:12]}, not the registered {commit[:12]}; "
            "it is not published"
        )
    run = run_folder(folder)
    if run is None or run_state(run, read_json(run / RESULTS_FILE)) != "ok":
        raise CampaignError(f"{folder}: the job has not finished")
    target = published_dir(job, results)
    recover_folder(target)
    done = published_jobs(target)
    if any((j["arm"], j["seed"]) == (job.arm, job.seed) for j in done):
        raise CampaignError(f"{folder}: {job.name} is already published in {target}")
    staging = target.with_name(f".{target.name}.publishing")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name, table in _merged_tables(target, run, job).items():
        table.to_csv(staging / name, index=False)
    outcome = read_json(run / RESULTS_FILE)
    entry = {
        "arm": job.arm, "seed": job.seed, "pilot": job.pilot, "commit": commit, "run_folder": run.name,
        "wall_time_s": outcome.get("run_seconds") or outcome.get("train_seconds"),
        "finished": outcome.get("finished"), "cpu": cpu_model(),
    }  # fmt: skip
    summary = {
        "status": "ok", "experiment": job.experiment, "preset": job.preset, "confirmatory": True,
        "registered_commit": commit, "jobs": [*done, entry],
    }  # fmt: skip
    write_json(staging / RESULTS_FILE, summary)
    shutil.copy2(run / "params.json", staging / "params.json")
    replace_folder(staging, target)
    return target


@dataclass
class CampaignState:
    """What is published, what runs and what is left of the design."""

    claims: list[RegisteredClaim]
    jobs: list[Job]
    published: set[tuple[str, str, str, int]]

    def remaining(self) -> list[Job]:
        """Return the registered jobs not published yet, in priority order."""
        return [j for j in self.jobs if j.key not in self.published]


def results_root(root: Path | None = None) -> Path:
    """Return the folder confirmatory jobs are published under: ``data/results`` of the checkout ``root``."""
    return (root / "data" if root is not None else data_dir()) / "results"


def campaign_state(root: Path | None = None) -> CampaignState:
    """Return the design of the checkout ``root`` (default this one), its jobs and the set already published."""
    results = results_root(root)
    claims = read_design(results.parent / SPEC_FILE)
    jobs = registered_jobs(claims)
    published = set()
    for folder in {published_dir(j, results) for j in jobs}:
        for entry in published_jobs(folder):
            published.add((folder.parent.name, folder.name, entry["arm"], int(entry["seed"])))
    return CampaignState(claims, jobs, published)


ANY_CPU = ""
"""The ``cpu`` of :func:`expected_minutes` that takes the longest time on any CPU (what a page any machine
regenerates shows)."""


def expected_minutes(job: Job, results: Path | None = None, cpu: str | None = None) -> float:
    """Return the longest wall time a published job of the same arm took on this CPU, else its longest on
    any scaled by this CPU's speed, else the registered minutes.

    Jobs are published on the machine that trained them, which records its CPU (:func:`rlq.core.cpu.cpu_model`,
    vector extensions included); ``cpu`` (default: this machine's; :data:`ANY_CPU`: none) picks the jobs
    timed on the same kind of CPU, so that a machine several times faster than the slowest one seen is not
    held to its times. An arm not yet timed on this CPU takes its longest time on any, multiplied by the
    largest ratio (this CPU over the others, longest against longest) of another arm of the same published
    runs timed on both. Jobs published before the CPU was recorded count as timed on another.
    """
    cpu = cpu_model() if cpu is None else cpu
    timed: dict[str, dict[bool, list[float]]] = {}
    for e in published_jobs(published_dir(job, results)):
        if e.get("wall_time_s"):
            here = bool(cpu) and e.get("cpu") == cpu
            timed.setdefault(e.get("arm", ""), {True: [], False: []})[here].append(
                float(e["wall_time_s"]) / 60.0
            )
    mine = timed.get(job.arm)
    if mine is None:
        return job.minutes
    if mine[True]:
        return max(mine[True])
    speed = [max(t[True]) / max(t[False]) for t in timed.values() if t[True] and t[False]]
    return max(mine[False]) * (max(speed) if speed else 1.0)


def pilot_value(
    claim: RegisteredClaim, claims: list[RegisteredClaim], results: Path | None = None
) -> float | None:
    """Return the published pilot's score, the value the claim's floor is checked against (None before it ran).

    The score is the pilot arm's value of the column of :func:`~rlq.claims.design.pilot_gate`'s claim.
    """
    if claim.pilot is None:
        return None
    gate = pilot_gate(claim, claims)
    path = published_dir(gate, results) / gate.table
    if not path.is_file():
        return None
    table = pd.read_csv(path)
    arm, seed = claim.pilot
    rows = table[(table["campaign_arm"] == arm) & (table["campaign_seed"] == seed)]
    return float(rows[gate.column].mean()) if len(rows) else None


def pilot_hold(job: Job, state: CampaignState, results: Path | None = None) -> str | None:
    """Return why ``job`` may not start: ``"waiting"`` for its claim's pilot, ``"below the floor"`` when the
    pilot scored below it (the registered rule stops the claim's jobs for good), else None."""
    for claim in state.claims:
        if claim.pilot is None or job.pilot or (claim.experiment, claim.published_as) != job.key[:2]:
            continue
        value = pilot_value(claim, state.claims, results)
        if value is None:
            return "waiting"
        if claim.floor is not None and value < claim.floor:
            return "below the floor"
    return None


def blocked_by_pilot(job: Job, state: CampaignState, results: Path | None = None) -> bool:
    """Return True when ``job`` waits for its claim's pilot, or the pilot fell below the floor."""
    return pilot_hold(job, state, results) is not None


def jobs_left(state: CampaignState, results: Path | None = None) -> tuple[list[Job], list[Job]]:
    """Return the unpublished jobs still to run and those the floor rule stopped, each in priority order."""
    stopped = [j for j in state.remaining() if pilot_hold(j, state, results) == "below the floor"]
    return [j for j in state.remaining() if j not in stopped], stopped


def claim_outcomes(state: CampaignState, results: Path | None = None) -> dict[str, Any]:
    """Return every registered claim's outcome on the published confirmatory runs."""
    outcomes: dict[str, Any] = {}
    for claim in state.claims:
        if not claim.runs:
            continue
        path = published_dir(claim, results) / claim.table
        table = pd.read_csv(path) if path.is_file() else None
        mine = [
            j for j in state.jobs if (j.experiment, j.published_as) == (claim.experiment, claim.published_as)
        ]
        complete = all(j.key in state.published for j in mine if j.arm in dict(claim.arms) and not j.pilot)
        outcomes[claim.id] = judge(claim, table, complete, pilot_value(claim, state.claims, results))
    for claim in state.claims:
        if claim.statistic == "joint":
            outcomes[claim.id] = judge_joint(claim, [outcomes[p] for p in claim.parts])
        elif not claim.runs:
            outcomes[claim.id] = judge(claim, None, True)
    return outcomes


def _publish_finished(root: Path, commits: dict, state: CampaignState, running: dict) -> list[str]:
    lines = []
    for job in state.remaining():
        folder = job_dir(root, job)
        if job.key in running or not (folder / JOB_FILE).is_file():
            continue
        run = run_folder(folder)
        if run is None or run_state(run, read_json(run / RESULTS_FILE)) != "ok":
            continue
        try:
            publish_job(folder, commits[job.key], results_root(root))
        except CampaignError as err:
            lines.append(f"not published: {err}")
            continue
        state.published.add(job.key)
        lines.append(f"published {job.experiment}/{job.published_as} {job.name}")
    return lines


@dataclass
class _Batch:
    """One ``run_campaign`` call: where it runs, its deadline, and the jobs it started or saw fail."""

    root: Path
    commits: dict
    """The commit each job trains under (:func:`job_commits`)."""
    deadline: float
    workers: int
    address: str
    say: Callable[[str], None]
    running: dict = field(default_factory=dict)
    failed: set = field(default_factory=set)

    def reap(self) -> None:
        """Forget the jobs whose process ended; report those that failed."""
        for key, (job, process) in list(self.running.items()):
            if process.poll() is None:
                continue
            del self.running[key]
            if process.returncode != 0:
                self.failed.add(key)
                self.say(
                    f"failed {job.experiment}/{job.published_as} {job.name} (see {job_dir(self.root, job)}/job.log)"
                )

    def start(self, state: CampaignState, elsewhere: list[Job]) -> None:
        """Start the remaining jobs, in priority order, that fit before the deadline on a free worker."""
        results = results_root(self.root)
        for job in state.remaining():
            if len(self.running) + len(elsewhere) >= self.workers:
                return
            if job.key in self.running or job.key in self.failed or job in elsewhere:
                continue
            minutes = expected_minutes(job, results)
            if blocked_by_pilot(job, state, results) or time.time() + minutes * 60.0 > self.deadline:
                continue
            commit = self.commits[job.key]
            tree = ensure_worktree(self.root, commit)
            self.running[job.key] = (job, launch(job, self.root, tree, commit, self.address))
            self.say(f"started {job.experiment}/{job.published_as} {job.name} (about {minutes:.0f} min)")


def run_campaign(
    hours: float,
    workers: int = 2,
    address: str = "",
    root: Path | None = None,
    say: Callable[[str], None] = print,
    poll: float = 30.0,
) -> int:
    """Run the design's remaining jobs for ``hours`` on ``workers`` processes; return the jobs published.

    Starts a job only when its expected duration ends before the deadline, in priority order; publishes each
    job as soon as it finishes. A job that fails is reported and not started again in this call. With a Ray
    cluster's ``address`` every remaining job starts at once, each as a Ray task of its notebook.
    """
    root = root or repo_root()
    state = campaign_state(root)
    commits = job_commits(state, claim_commits(root))
    workers = max(1, len(state.remaining())) if address else workers
    batch = _Batch(root, commits, time.time() + hours * 3600.0, workers, address, say)
    published = 0
    while True:
        batch.reap()
        lines = _publish_finished(root, commits, state, batch.running)
        published += sum(line.startswith("published") for line in lines)
        for line in lines:
            say(line)
        elsewhere = [
            j for j in state.remaining() if j.key not in batch.running and running_elsewhere(root, j)
        ]
        batch.start(state, elsewhere)
        if not batch.running and not elsewhere:
            if not jobs_left(state, results_root(root))[0]:
                say(
                    "every registered job is published: nothing left to run (`rlq campaign status` gives the verdicts)"
                )
            return published
        time.sleep(poll)
