"""A run of a notebook's ``runs`` parameter (:class:`RunSpec`): algorithm, environment, budget and settings,
rl-zoo3's when asked (:mod:`rlq.rl.zoo`), and the fresh SB3 model it trains."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

ON_POLICY = ("A2C", "PPO")
"""Algorithms that collect with several environments at once (``n_envs_on_policy``); the others use one."""

ZOO = "zoo"
"""In a run entry, ``"zoo"`` in place of the steps asks for rl-zoo3's budget and tuned settings
(:func:`rlq.rl.zoo.zoo_hyperparams`); as the 4th item after explicit steps, for the settings alone."""


@dataclass(frozen=True)
class RunSpec:
    """One entry of a QuaRL notebook's ``runs``: algorithm, environment, training steps and hyperparameters.

    Entries: ``[algorithm, env_id, steps]`` (rlq's defaults, :data:`rlq.rl.agents.TUNED_HYPERPARAMS`),
    ``[algorithm, env_id, steps, {overrides}]``, ``[algorithm, env_id, "zoo"]`` (rl-zoo3's budget, number of
    environments, policy and hyperparameters, read from the installed ``rl_zoo3``), ``[algorithm, env_id,
    "zoo", {overrides}]`` and ``[algorithm, env_id, steps, "zoo"]`` (the zoo's settings at another budget).
    """

    algorithm: str
    env_id: str
    steps: int
    hyperparams: dict[str, Any] = field(default_factory=dict)
    zoo_n_envs: int | None = None
    """The zoo's number of training environments (None: ``n_envs_on_policy`` for A2C and PPO, else 1)."""
    policy: str | None = None
    """The SB3 policy name (None: ``CnnPolicy`` for Atari, else ``MlpPolicy``)."""
    zoo: bool = False
    """Whether the settings come from rl-zoo3."""

    @classmethod
    def parse(cls, spec: Sequence[Any]) -> RunSpec:
        """Return the run of a notebook entry (see the class docstring for the forms it takes)."""
        if not isinstance(spec, (list, tuple)) or len(spec) not in (3, 4):
            raise ValueError(
                'a run is [algorithm, environment, steps or "zoo"] and optionally hyperparameters '
                f'(a dict, or "zoo" after explicit steps), got {spec!r}'
            )
        algorithm, env_id, steps = str(spec[0]), str(spec[1]), spec[2]
        extra = spec[3] if len(spec) == 4 else {}
        if steps != ZOO and extra != ZOO:
            if not isinstance(extra, dict):
                raise ValueError(f'a run\'s 4th item is a dict of hyperparameters or "zoo", got {extra!r}')
            return cls(algorithm, env_id, int(steps), dict(extra))
        if steps == ZOO and not isinstance(extra, dict):
            raise ValueError(f'after "zoo" steps a run takes a dict of overrides, got {extra!r}')
        from rlq.rl.zoo import zoo_hyperparams

        zoo = zoo_hyperparams(algorithm, env_id)
        hyperparams = {**zoo.hyperparams, **(extra if isinstance(extra, dict) else {})}
        budget = zoo.n_timesteps if steps == ZOO else int(steps)
        return cls(zoo.algorithm, env_id, budget, hyperparams, zoo.n_envs, zoo.policy, True)

    @property
    def name(self) -> str:
        """Return the run's name in tables, e.g. ``"PPO CartPole-v1"``."""
        return f"{self.algorithm} {self.env_id}"

    @property
    def folder(self) -> str:
        """Return the run's folder name, e.g. ``"PPO_CartPole-v1"``."""
        return f"{self.algorithm}_{self.env_id.replace('/', '_')}"

    def n_envs(self, n_envs_on_policy: int) -> int:
        """Return the run's number of training environments: the zoo's, else ``n_envs_on_policy`` (A2C, PPO) or 1."""
        if self.zoo_n_envs is not None:
            return self.zoo_n_envs
        return n_envs_on_policy if self.algorithm in ON_POLICY else 1

    def model(self, seed: int, n_envs_on_policy: int) -> Any:
        """Return a fresh SB3 model of this run, seeded ``seed``: its algorithm, hyperparameters, policy and envs."""
        from rlq.rl.agents import make_model

        return make_model(
            self.algorithm,
            self.env_id,
            seed=seed,
            n_envs=self.n_envs(n_envs_on_policy),
            hyperparams=self.hyperparams,
            policy=self.policy,
        )


def parse_runs(runs: Sequence[Sequence[Any]]) -> list[RunSpec]:
    """Return a notebook's ``runs`` parameter as :class:`RunSpec` objects."""
    return [RunSpec.parse(spec) for spec in runs]
