"""The training jobs of the confirmatory design: one per experiment, preset, arm and seed.

Every registered claim decided by runs names its arms (``gst:10;dense:10``); a job trains one arm on one seed
with the registered preset, through ``rlq run`` and the notebook's own parameters (:func:`job_overrides`).
Claims that share an experiment and preset share their jobs (the TD3 gain and reward claims both read the
GST seeds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlq.claims.design import SEED_START, RegisteredClaim

TASK_RUNS = {"td3_pendulum": ["TD3", "Pendulum-v1", "zoo"]}
"""QuaRL's arms: the training run (algorithm, environment, rl-zoo3's budget) each names."""


@dataclass(frozen=True, order=True)
class Job:
    """One training run of the design."""

    priority: int
    experiment: str
    preset: str
    published_as: str
    arm: str
    seed: int
    minutes: float
    """Expected minutes on one core (the registered ``job_minutes``)."""
    pilot: bool = False

    @property
    def key(self) -> tuple[str, str, str, int]:
        """Return what names the job: experiment, published folder, arm and seed."""
        return (self.experiment, self.published_as, self.arm, self.seed)

    @property
    def name(self) -> str:
        """Return the job's folder name under its published folder's runs, e.g. ``gst-1003``."""
        return f"{self.arm}-{self.seed}"


def job_overrides(experiment: str, arm: str, seed: int) -> dict[str, Any]:
    """Return the ``-p`` parameters that make the registered preset train ``arm`` on ``seed`` alone, on one
    worker."""
    if experiment in ("gst_td3_mujoco", "gst_a2c_atari"):
        return {"methods": [arm], "seeds": [seed], "method_seeds": {}, "workers": 1}
    if experiment == "gst_ppo_football":
        return {"methods": [arm], "seeds": [seed], "workers": 1}
    if experiment in ("quarl_ptq", "quarl_qat"):
        if arm not in TASK_RUNS:
            raise ValueError(f"{experiment}: unknown arm {arm!r}; known: {', '.join(TASK_RUNS)}")
        return {"runs": [TASK_RUNS[arm]], "seeds": [seed], "workers": 1}
    if experiment == "quarl_actorq":
        return {"convergence_seeds": [seed], "workers": 1}
    raise ValueError(f"no confirmatory jobs are defined for experiment {experiment!r}")


def registered_jobs(claims: list[RegisteredClaim]) -> list[Job]:
    """Return every job the design registers, once each, in priority order (pilots first within a priority)."""
    jobs: dict[tuple[str, str, str, int], Job] = {}

    def add(job: Job) -> None:
        known = jobs.get(job.key)
        if known is None or job.priority < known.priority:
            jobs[job.key] = job

    for claim in claims:
        if not claim.runs:
            continue
        common = (claim.experiment, claim.preset, claim.published_as)
        if claim.pilot is not None:
            add(Job(claim.priority, *common, claim.pilot[0], claim.pilot[1], claim.job_minutes, pilot=True))
        for arm, count in claim.arms:
            for seed in range(SEED_START, SEED_START + count):
                add(Job(claim.priority, *common, arm, seed, claim.job_minutes))
    return sorted(jobs.values(), key=lambda j: (j.priority, not j.pilot, j.seed, j.arm, j.experiment))
