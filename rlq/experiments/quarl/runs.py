"""QuaRL runs: a notebook's ``runs`` entries (:class:`RunSpec`), the seeds they share, and their fp32 agents."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlq.rl.agents import TrainedAgent

Progress = Callable[[str], Any] | None

ON_POLICY = ("A2C", "PPO")
"""Algorithms that collect with several environments at once (``n_envs_on_policy``); the others use one."""

CALIBRATION_SEED_OFFSET = 20_000
"""The rollout that calibrates a quantized policy of a run trained with ``seed`` is seeded ``seed +
CALIBRATION_SEED_OFFSET``: apart from the training and the evaluation episodes (:data:`EVAL_SEED_OFFSET`)."""


# --------------------------------------------------------------------------------------------------------
# Runs


@dataclass(frozen=True)
class RunSpec:
    """One entry of a QuaRL notebook's ``runs``: ``[algorithm, environment, training steps]`` and optional hyperparameters."""

    algorithm: str
    env_id: str
    steps: int
    hyperparams: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: Sequence[Any]) -> RunSpec:
        """Return the run ``[algorithm, environment, steps]`` or ``[algorithm, environment, steps, hyperparams]``."""
        if len(spec) not in (3, 4):
            raise ValueError(
                f"a run is [algorithm, environment, steps] and optionally hyperparameters, got {spec!r}"
            )
        return cls(str(spec[0]), str(spec[1]), int(spec[2]), dict(spec[3]) if len(spec) == 4 else {})

    @property
    def name(self) -> str:
        """Return the run's name in tables, e.g. ``"PPO CartPole-v1"``."""
        return f"{self.algorithm} {self.env_id}"

    @property
    def folder(self) -> str:
        """Return the run's folder name, e.g. ``"PPO_CartPole-v1"``."""
        return f"{self.algorithm}_{self.env_id.replace('/', '_')}"

    def n_envs(self, n_envs_on_policy: int) -> int:
        """Return how many environments the run trains with: ``n_envs_on_policy`` for A2C and PPO, else 1."""
        return n_envs_on_policy if self.algorithm in ON_POLICY else 1

    def train(
        self,
        folder: str | Path,
        *,
        seed: int,
        n_envs_on_policy: int,
        checkpoint_every: int = 0,
        callback: Any = None,
    ) -> TrainedAgent:
        """Return this run's agent trained (or resumed) in ``folder`` with ``seed``, its hyperparameters and envs."""
        from rlq.rl.agents import train_agent

        return train_agent(
            self.algorithm,
            self.env_id,
            self.steps,
            seed=seed,
            n_envs=self.n_envs(n_envs_on_policy),
            hyperparams=self.hyperparams,
            run_dir=folder,
            checkpoint_every=checkpoint_every,
            callback=callback,
        )


def parse_runs(runs: Sequence[Sequence[Any]]) -> list[RunSpec]:
    """Return a notebook's ``runs`` parameter as :class:`RunSpec` objects."""
    return [RunSpec.parse(spec) for spec in runs]


@dataclass
class AgentRun:
    """An fp32 agent trained for one :class:`RunSpec`, in its folder."""

    spec: RunSpec
    folder: Path
    trained: TrainedAgent


def train_fp32_agents(
    specs: Sequence[RunSpec],
    *,
    seed: int,
    n_envs_on_policy: int,
    out: str | Path,
    checkpoint_every: int = 0,
    progress: Progress = None,
) -> dict[str, AgentRun]:
    """Return one fp32 agent per run (by :attr:`RunSpec.name`), each trained in ``out/agents/<run>/`` and resumable there."""

    agents = {}
    for spec in specs:
        folder = Path(out) / "agents" / spec.folder
        trained = spec.train(
            folder, seed=seed, n_envs_on_policy=n_envs_on_policy, checkpoint_every=checkpoint_every
        )
        agents[spec.name] = AgentRun(spec, folder, trained)
        if progress is not None:
            resumed = f" (resumed from {trained.resumed_from})" if trained.resumed_from else ""
            progress(
                f"{spec.name}: {trained.model.num_timesteps} steps in {trained.wall_time_s:.0f} s{resumed}"
            )
    return agents
