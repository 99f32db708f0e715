"""Train what a notebook built, over tasks and seeds: :func:`run_seeds` receives the agent and the callbacks.

A notebook shows its method in a cell: the agent (:class:`Agent`: an SB3 algorithm with its hyperparameters)
and one compression callback per method, built there with their knobs (``GSTCallback(...)``,
``GradualPruningCallback(...)``, ``CompressionCallback(...)`` for dense training). :func:`run_seeds` trains a
fresh copy of each callback per task and seed, ``workers`` at a time in processes or on Ray, with checkpoints
and resume (:func:`rlq.experiments.gst.train_and_evaluate_all`), and returns the runs' tables.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from rlq.experiments.gst.training_runs import train_and_evaluate_all
from rlq.rl.agents import TrainedAgent, train_agent
from rlq.sb3.compression import CompressionCallback


@dataclass
class Agent:
    """An SB3 agent to train: its algorithm and the arguments its constructor gets."""

    algo: str
    """SB3 algorithm name: TD3, SAC, DDPG, A2C, PPO or DQN."""
    hyperparams: dict[str, Any] = field(default_factory=dict)
    """Constructor arguments (rl-zoo3's tuned ones, or a notebook's), plus ``action_noise_std`` for TD3/DDPG."""
    policy: str | None = None
    """SB3 policy name; None picks ``CnnPolicy`` for Atari and ``MlpPolicy`` otherwise."""
    n_envs: int = 1
    """Environments stepped side by side."""

    def train(self, env_id: str, total_timesteps: int, *, seed: int = 0, **options: Any) -> TrainedAgent:
        """Return this agent trained on ``env_id`` by :func:`rlq.rl.agents.train_agent` (``options``: its run_dir, ...)."""
        return train_agent(
            self.algo, env_id, total_timesteps, seed=seed, n_envs=self.n_envs, hyperparams=self.hyperparams,
            policy=self.policy, **options,
        )  # fmt: skip


def seed_jobs(
    agent: Agent,
    callbacks: Mapping[str, CompressionCallback],
    *,
    env_ids: Sequence[str],
    seeds: Sequence[int],
    total_timesteps: int,
    out: str | Path,
    method_seeds: Mapping[str, Sequence[int]] | None = None,
    keys: Mapping[str, Mapping[str, Any]] | None = None,
    **job: Any,
) -> list[dict[str, Any]]:
    """Return one training job per task, seed and method (in that nesting), each with a fresh copy of its callback.

    A run's folder is ``out/runs/<env id>__<method>__<seed>`` and its ``keys`` are the env id, seed and method,
    which name its result for resuming and label its tables' rows; ``keys[method]`` adds columns of that
    method's own or replaces them (a sweep's ``{"method": "gst", "config": ..., "s_shift": ...}``).
    ``method_seeds`` gives a method its own seeds (a subset of ``seeds``). ``job`` holds what every run
    shares (``eval_episodes``, ``checkpoint_every``, ``torch_threads``, ...).
    """
    for method, callback in callbacks.items():
        if not isinstance(callback, CompressionCallback):
            raise TypeError(
                f"callbacks[{method!r}] must be an rlq compression callback (CompressionCallback, GSTCallback, "
                f"GradualPruningCallback), got {type(callback).__name__}"
            )
        if getattr(callback, "model", None) is not None:
            raise ValueError(f"callbacks[{method!r}] has trained already: build a fresh one for run_seeds")
    method_seeds = dict(method_seeds or {})
    for method, subset in method_seeds.items():
        if method not in callbacks or not set(subset) <= set(seeds):
            raise ValueError(
                f"method_seeds[{method!r}] = {list(subset)} must name a method of {list(callbacks)} and a subset "
                f"of seeds {list(seeds)}"
            )
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must not repeat, got {list(seeds)}")
    return [
        dict(
            method=method,
            algo=agent.algo,
            env_id=env_id,
            total_timesteps=total_timesteps,
            seed=seed,
            keys={"env_id": env_id, "seed": seed, "method": method, **dict((keys or {}).get(method, {}))},
            run_dir=Path(out) / "runs" / _folder_name(f"{env_id}__{method}__{seed}"),
            callback=copy.deepcopy(callback),
            hyperparams=copy.deepcopy(agent.hyperparams),
            policy=agent.policy,
            n_envs=agent.n_envs,
            **job,
        )  # fmt: skip
        for env_id in env_ids
        for seed in seeds
        for method, callback in callbacks.items()
        if seed in method_seeds.get(method, seeds)
    ]


def _folder_name(name: str) -> str:
    """Return ``name`` with every character other than letters, digits and ``._-`` made ``_`` (a sweep's labels)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def run_seeds(  # noqa: PLR0913
    agent: Agent,
    callbacks: Mapping[str, CompressionCallback],
    *,
    env_ids: Sequence[str],
    seeds: Sequence[int],
    total_timesteps: int,
    out: str | Path,
    method_seeds: Mapping[str, Sequence[int]] | None = None,
    keys: Mapping[str, Mapping[str, Any]] | None = None,
    workers: int = 1,
    executor: str = "processes",
    ray_address: str | None = None,
    progress: Callable[[str], Any] | None = None,
    **job: Any,
) -> tuple[list[dict[str, Any]], dict[str, pd.DataFrame]]:
    """Return every run's result and the runs' stacked tables, after training ``agent`` with each callback.

    One run per task, seed and method (:func:`seed_jobs`), ``workers`` at a time in processes or on Ray at
    ``ray_address`` (``executor``), labelled by ``keys`` (:func:`seed_jobs`); each is evaluated on
    ``eval_episodes`` deterministic episodes and checkpointed every ``checkpoint_every`` steps. A run folder ``out`` that already holds finished runs loads
    them, and an interrupted run resumes from its newest checkpoint. The tables (``summary``, ``history``,
    ``curve``, ``events``) are also written to ``out/<table>.csv`` (what ``rlq publish`` commits).
    """
    jobs = seed_jobs(
        agent, callbacks, env_ids=env_ids, seeds=seeds, total_timesteps=total_timesteps, out=out,
        method_seeds=method_seeds, keys=keys, **job,
    )  # fmt: skip
    return train_and_evaluate_all(
        jobs, workers=workers, executor=executor, ray_address=ray_address, out=out, progress=progress
    )
