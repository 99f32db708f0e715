"""An ActorQ actor: pulls the latest quantized policy every ``update_period`` steps and acts with it.

The same class runs in the driver process (``backend="local"``) and as a Ray actor (``backend="ray"``);
only the :class:`PolicyStore` client it pulls through differs. Every call of :meth:`ActorWorker.run`
returns its transitions with plain timers of each piece of an actor's time (QuaRL's runtime breakdown):
environment step, inference, pull, deserialize and load into the actor's model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from rlq.actorq.architecture import PolicyArchitecture
from rlq.actorq.broadcast import decode_policy
from rlq.actorq.inference import make_engine

ACTOR_TIMERS = (
    "actor_env_step",
    "actor_inference",
    "actor_pull",
    "actor_deserialize",
    "actor_load",
    "actor_other",
)
"""Breakdown keys of an actor's time, in seconds."""


class LocalPolicyStore:
    """Where the broadcaster publishes the latest policy blob in one process; actors pull a copy of it."""

    def __init__(self) -> None:
        self.version = -1
        self.blob: bytes | None = None

    def publish(self, blob: bytes, version: int) -> None:
        """Make ``blob`` (policy ``version``) the latest policy."""
        self.blob, self.version = blob, int(version)

    def pull(self, have_version: int) -> tuple[int, bytes] | None:
        """Return ``(version, bytes)`` of the latest policy if newer than ``have_version``, else None."""
        if self.blob is None or self.version <= have_version:
            return None
        return self.version, bytes(self.blob)  # the copy stands for the transfer a remote actor makes


@dataclass
class ChunkResult:
    """What an actor sends back after one update period: transitions, finished episodes and its timers."""

    actor_id: int
    """Index of the actor."""
    policy_version: int
    """Version of the policy the actor acted with."""
    obs: np.ndarray
    """Observations, shape (steps, obs_dim)."""
    actions: np.ndarray
    """Actions as the policy outputs them, in [-1, 1] (SB3's replay convention), shape (steps, act_dim)."""
    rewards: np.ndarray
    """Rewards, shape (steps,)."""
    next_obs: np.ndarray
    """Next observations (the final one of an episode, not the reset one), shape (steps, obs_dim)."""
    terminated: np.ndarray
    """True where the episode ended in a terminal state."""
    truncated: np.ndarray
    """True where the episode was cut by a time limit (bootstrapped by the learner)."""
    episode_returns: list[float] = field(default_factory=list)
    """Returns of the episodes that ended in this chunk."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent in each of :data:`ACTOR_TIMERS`."""
    loaded: bool = False
    """Whether a new policy was pulled and loaded at the start of this chunk."""
    pid: int = 0
    """Process id of the actor (changes when a Ray actor is restarted)."""

    @property
    def steps(self) -> int:
        """Return the number of transitions."""
        return len(self.rewards)


@dataclass(frozen=True)
class Exploration:
    """How an actor explores: uniformly random actions first, then its policy's action plus Gaussian noise."""

    noise: float = 0.1
    """Std of the Gaussian noise added to the deterministic action in [-1, 1] (TD3 / DDPG); SAC samples instead."""
    random_steps: int = 0
    """Steps acted uniformly at random before the pulled policy acts (filling the replay buffer)."""


class ActorWorker:
    """One actor: an environment, an inference engine at the actor precision, exploration noise.

    It acts uniformly at random for its first ``exploration.random_steps`` steps (filling the replay buffer
    before learning starts), then with the pulled policy plus Gaussian noise of std ``exploration.noise``
    (TD3 / DDPG) or by sampling its squashed Gaussian (SAC).
    """

    def __init__(
        self,
        actor_id: int,
        env_id: str,
        arch: PolicyArchitecture,
        precision: str,
        backend: str,
        seed: int,
        exploration: Exploration = Exploration(),
        set_threads: bool = False,
    ):
        import os

        # a Ray actor owns its process: one thread, as in the paper (compiled actors pack policies with torch ops)
        if set_threads and backend in ("torch", "compiled"):
            import torch

            torch.set_num_threads(1)
        from rlq.rl.envs import make_env

        self.actor_id, self.arch, self.noise = actor_id, arch, float(exploration.noise)
        self.random_steps = int(exploration.random_steps)
        self.env = make_env(env_id)
        self.engine = make_engine(arch, precision, backend)
        self.version = -1
        self.total_steps = 0
        self.pid = os.getpid()
        self.reseed(seed)

    def reseed(self, seed: int) -> None:
        """Start a fresh episode and noise stream from ``seed``."""
        self.rng = np.random.default_rng(seed)
        self.obs, _ = self.env.reset(seed=int(seed))
        self.episode_return = 0.0

    def pull(self, store, timings: dict[str, float]) -> bool:
        """Return whether a newer policy was pulled from ``store`` and loaded (timers added to ``timings``)."""
        start = time.perf_counter()
        got = store.pull(self.version)
        pulled = time.perf_counter()
        timings["actor_pull"] += pulled - start
        if got is None:
            return False
        version, blob = got
        policy = decode_policy(blob)
        decoded = time.perf_counter()
        self.engine.load(policy)
        loaded = time.perf_counter()
        timings["actor_deserialize"] += decoded - pulled
        timings["actor_load"] += loaded - decoded
        self.version = version
        return True

    def act(self, obs: np.ndarray, explore: bool = True) -> np.ndarray:
        """Return the action in [-1, 1] for one observation (with exploration when ``explore``)."""
        out = self.engine(obs.reshape(1, -1))
        if self.arch.stochastic:
            mean, log_std = out[0][0], out[1][0]
            if explore:
                mean = mean + np.exp(log_std) * self.rng.standard_normal(mean.shape).astype(np.float32)
            return np.tanh(mean)
        action = out[0][0]
        if explore and self.noise > 0:
            action = np.clip(action + self.noise * self.rng.standard_normal(action.shape), -1.0, 1.0)
        return action.astype(np.float32)

    def run(self, n_steps: int, store, reseed: int | None = None) -> ChunkResult:
        """Return ``n_steps`` transitions collected after pulling the latest policy from ``store``."""
        begin = time.perf_counter()
        if reseed is not None:
            self.reseed(reseed)
        timings = dict.fromkeys(ACTOR_TIMERS, 0.0)
        loaded = self.pull(store, timings)
        if self.version < 0:
            raise RuntimeError("no policy has been published yet")
        obs_dim, act_dim = self.arch.obs_dim, self.arch.act_dim
        obs = np.empty((n_steps, obs_dim), np.float32)
        next_obs = np.empty((n_steps, obs_dim), np.float32)
        actions = np.empty((n_steps, act_dim), np.float32)
        rewards = np.empty(n_steps, np.float32)
        terminated = np.zeros(n_steps, bool)
        truncated = np.zeros(n_steps, bool)
        returns: list[float] = []
        inference = env_time = 0.0
        clock = time.perf_counter
        for t in range(n_steps):
            t0 = clock()
            if self.total_steps < self.random_steps:
                action = self.rng.uniform(-1.0, 1.0, act_dim).astype(np.float32)
            else:
                action = self.act(self.obs)
            t1 = clock()
            nxt, reward, term, trunc, _ = self.env.step(self.arch.unscale(action))
            obs[t], actions[t], rewards[t], next_obs[t] = self.obs, action, reward, nxt
            terminated[t], truncated[t] = term, trunc
            self.episode_return += float(reward)
            self.total_steps += 1
            if term or trunc:
                returns.append(self.episode_return)
                self.episode_return = 0.0
                nxt, _ = self.env.reset()
            self.obs = nxt
            inference += t1 - t0
            env_time += clock() - t1
        timings["actor_inference"] = inference
        timings["actor_env_step"] = env_time
        measured = sum(timings.values())
        timings["actor_other"] = max(0.0, time.perf_counter() - begin - measured)
        return ChunkResult(
            self.actor_id, self.version, obs, actions, rewards, next_obs, terminated, truncated,
            returns, timings, loaded, self.pid,
        )  # fmt: skip

    def ping(self) -> int:
        """Return the actor's process id (a Ray actor answers once it is up)."""
        return self.pid

    def close(self) -> None:
        """Close the environment."""
        self.env.close()
