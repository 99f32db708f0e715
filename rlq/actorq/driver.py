"""ActorQ training: the driver loop that ties learner, broadcaster and actors together.

The driver hosts the learner and the broadcaster. It hands actors chunks of ``update_period`` steps
(each chunk starts with a pull of the latest policy), writes the transitions they send into the replay
buffer, and runs the learner as a Reverb-style rate limiter allows: ``samples_per_insert / batch_size``
gradient steps per inserted transition, with actors paused when they run more than ``max_insert_lead``
transitions ahead. After every ``broadcast_every`` learner steps the broadcaster quantizes the policy to
``comm_precision`` and publishes it. The same loop drives both runtimes; only where the actors run differs.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from rlq.actorq.actor import ACTOR_TIMERS
from rlq.actorq.actor_runtimes import ActorFailure, actor_seed, make_runtime
from rlq.actorq.broadcast import encode_policy
from rlq.actorq.config import ActorQConfig
from rlq.actorq.evaluator import Evaluator
from rlq.actorq.inference import choose_backend, engine_label
from rlq.actorq.learner import Learner, check_resumable, has_checkpoint, write_config
from rlq.actorq.policy import architecture_of, policy_weights
from rlq.actorq.result import (
    BREAKDOWN_KEYS,
    EPISODE_COLUMNS,
    HISTORY_COLUMNS,
    LEARNER_TIMERS,
    PER_ACTOR_COLUMNS,
    ActorQResult,
    TrainingProgress,
)
from rlq.quant.latency import torch_threads

log = logging.getLogger(__name__)


def train(
    config: ActorQConfig, callback: Callable[[TrainingProgress], bool | None] | None = None
) -> ActorQResult:
    """Return the result of ActorQ training as ``config`` says, resuming from its checkpoint folder if it holds one.

    ``callback(progress)`` runs after each round of learner updates; returning False stops training early
    (a checkpoint is written first when ``checkpoint_dir`` is set). Every actor and every Ray process this
    call started is shut down when it returns or raises, KeyboardInterrupt included; a Ray instance that
    was already running is left running.
    """
    if not isinstance(config, ActorQConfig):
        raise TypeError(f"train() takes an ActorQConfig, got {type(config).__name__}")
    config.validate(check_env=True)
    check_resumable(config)
    threads = torch_threads(config.torch_threads) if config.torch_threads else contextlib.nullcontext()
    with threads:
        return _Run(config, callback).run()


class _Run:
    """The state of one call of :func:`train` (kept out of module globals)."""

    def __init__(self, config: ActorQConfig, callback: Callable[[TrainingProgress], bool | None] | None):
        self.config, self.callback = config, callback
        self.timers = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
        self.start = time.perf_counter()
        self.excluded = 0.0  # seconds not part of training wall-clock in this call
        folder = config.checkpoint_dir
        self.resumed = has_checkpoint(folder)
        if self.resumed:
            self.learner, state = Learner.load(config, Path(folder))
        else:
            self.learner, state = Learner.create(config), {}
        write_config(config)
        self.state = state
        self.learner_steps = int(state.get("learner_steps", 0))
        self.env_steps = int(state.get("env_steps", 0))
        self.wall_offset = float(state.get("wall_time_s", 0.0))
        self.elapsed_offset = float(state.get("elapsed_s", 0.0))
        self.history: list[dict] = list(state.get("history", []))
        self.episodes: list[dict] = list(state.get("episodes", []))
        for key, value in state.get("breakdown", {}).items():
            self.timers[key] = float(value) if key != "driver_other" else 0.0
        self.prior_other = float(state.get("breakdown", {}).get("driver_other", 0.0))
        self.broadcasts = int(state.get("broadcasts", 0))
        self.restarts = int(state.get("actor_restarts", 0))
        self.lost = int(state.get("actors_lost", 0))
        # Each actor's experience and deaths over all attempts; a resumed run may have more actors.
        self.per_actor = [dict(row) for row in state.get("per_actor", [])]
        for i in range(len(self.per_actor), config.n_actors):
            self.per_actor.append(dict(actor_id=i, env_steps=0, episodes=0, restarts=0, lost=False))
        self.restarts_now = [0] * config.n_actors  # restarts counted in this call, to match runtime.health()
        self.actor_steps = int(state.get("actor_steps", 0))
        self.actor_seconds = float(state.get("actor_seconds", 0.0))
        self.incarnation = int(state.get("resumes", -1)) + 1
        self.bytes_per_broadcast = int(state.get("bytes_per_broadcast", 0))
        self.blob: bytes | None = None
        self.last_broadcast = -1
        self.checkpoint: Path | None = None
        self.model_arch = architecture_of(self.learner.model)

    # --- pieces ----------------------------------------------------------------------------------------

    def wall_time(self) -> float:
        return self.wall_offset + time.perf_counter() - self.start - self.excluded

    def broadcast(self) -> None:
        t = time.perf_counter()
        blob = encode_policy(
            policy_weights(self.learner.model), self.config.broadcast_precision, self.learner_steps
        )
        self.runtime.publish(blob, self.learner_steps)
        self.timers["broadcast"] += time.perf_counter() - t
        self.blob, self.bytes_per_broadcast = blob, len(blob)
        self.broadcasts += 1
        self.last_broadcast = self.learner_steps

    def evaluate(self) -> None:
        if self.last_broadcast != self.learner_steps:
            self.broadcast()
        t = time.perf_counter()
        mean, std = self.evaluator(self.blob)
        pre_tanh, saturated = self.learner.saturation()
        spent = time.perf_counter() - t
        self.timers["evaluate"] += spent
        self.excluded += spent
        self.history.append(
            dict(
                wall_time_s=self.wall_time(),
                env_steps=self.env_steps,
                learner_steps=self.learner_steps,
                eval_return=mean,
                eval_return_std=std,
                policy_version=self.learner_steps,
                actor_mean_abs_pre_tanh=pre_tanh,
                actor_saturated_share=saturated,
            )
        )
        log.info("learner step %d, env step %d: eval return %.1f", self.learner_steps, self.env_steps, mean)

    def save(self) -> None:
        if self.config.checkpoint_dir is None:
            return
        t = time.perf_counter()
        state = self.snapshot()
        self.checkpoint = self.learner.save(Path(self.config.checkpoint_dir), self.learner_steps, state)
        spent = time.perf_counter() - t
        self.timers["checkpoint"] += spent
        self.excluded += spent

    def snapshot(self) -> dict[str, Any]:
        elapsed = time.perf_counter() - self.start
        return dict(
            env_steps=self.env_steps,
            wall_time_s=self.wall_time(),
            elapsed_s=self.elapsed_offset + elapsed,
            history=self.history,
            episodes=self.episodes,
            breakdown=self.breakdown(elapsed),
            broadcasts=self.broadcasts,
            actor_restarts=self.restarts,
            actors_lost=self.lost,
            per_actor=self.per_actor,
            actor_steps=self.actor_steps,
            actor_seconds=self.actor_seconds,
            resumes=self.incarnation,
            bytes_per_broadcast=self.bytes_per_broadcast,
            actor_backend=self.backend,
            backend_timings=self.backend_timings,
        )

    def breakdown(self, elapsed: float) -> dict[str, float]:
        out = dict(self.timers)
        driver_keys = [k for k in LEARNER_TIMERS if k != "driver_other"]
        accounted = sum(self.timers[k] for k in driver_keys) - self.timers_at_start
        if self.runtime_in_process:
            accounted += sum(self.timers[k] for k in ACTOR_TIMERS) - self.actor_timers_at_start
        out["driver_other"] = self.prior_other + max(0.0, elapsed - accounted)
        return out

    def allowed_updates(self) -> int:
        c = self.config
        if self.env_steps < max(c.learning_starts, 1):
            return 0
        return math.floor((self.env_steps - c.learning_starts) * c.samples_per_insert / c.batch_size)

    def may_submit(self) -> bool:
        c = self.config
        queued_steps = sum(self.queued) * c.update_period
        consumed = c.learning_starts + self.learner_steps * c.batch_size / c.samples_per_insert
        return self.env_steps + queued_steps + c.update_period <= consumed + self.lead

    def refill(self) -> None:
        depth = self.runtime.depth
        for _ in range(depth):
            for i in sorted(self.alive, key=lambda a: (self.queued[a], a)):
                if self.queued[i] < depth and self.may_submit():
                    self.runtime.submit(i, self.config.update_period, self.reseed.pop(i, None))
                    self.queued[i] += 1

    def count_restart(self, i: int) -> None:
        self.restarts += 1
        self.restarts_now[i] += 1
        self.per_actor[i]["restarts"] += 1

    def count_loss(self, i: int) -> None:
        self.alive.discard(i)
        self.lost += 1
        self.per_actor[i]["lost"] = True

    def count_unseen_deaths(self) -> None:
        """Count the deaths the loop has not seen: it notices one only when it next hears from that actor."""
        t = time.perf_counter()
        try:
            health = self.runtime.health()
        except Exception as e:  # noqa: BLE001 -- a failed check must not cost the finished run
            log.warning("could not check the actors' health at the end of the run (%s)", e)
            return
        for i, actor in enumerate(health):
            missed = actor.restarts - self.restarts_now[i]
            if missed > 0:
                log.warning(
                    "actor %d died %d time(s) unnoticed since the learner last heard from it", i, missed
                )
                for _ in range(missed):
                    self.count_restart(i)
            if actor.dead and i in self.alive:
                log.warning("actor %d is dead for good", i)
                self.count_loss(i)
        self.timers["shutdown"] += time.perf_counter() - t

    def on_failure(self, failure: ActorFailure) -> None:
        i = failure.actor_id
        if (
            failure.permanent
            or time.perf_counter() - self.failing_since.setdefault(i, time.perf_counter()) > 120
        ):
            log.warning("actor %d is dead for good (%s); training goes on without it", i, failure.error)
            self.count_loss(i)
            if hasattr(self.runtime, "drop"):
                self.runtime.drop(i)
            self.queued[i] = 0
            if not self.alive:
                raise RuntimeError(
                    f"every ActorQ actor died; the last error: {failure.error}"
                ) from failure.error
            return
        if not self.failing[i]:  # the first failure of this death; queued chunks fail with it
            log.warning("actor %d died (%s); Ray restarts it", i, type(failure.error).__name__)
            self.count_restart(i)
            self.failing[i] = True
        self.generation[i] += 1
        self.reseed[i] = actor_seed(self.config, i, self.incarnation + 1000 * self.generation[i])
        time.sleep(0.05)  # resubmitting to a restarting actor fails fast; do not spin

    def collect(self, block: bool) -> None:
        t = time.perf_counter()
        results = self.runtime.wait(block=block)
        waited = time.perf_counter() - t
        in_process = 0.0
        for i, res in results:
            self.queued[i] = max(0, self.queued[i] - 1)
            if isinstance(res, ActorFailure):
                self.on_failure(res)
                continue
            if i not in self.alive:
                continue
            self.failing_since.pop(i, None)
            if self.pids[i] is not None and res.pid != self.pids[i] and not self.failing[i]:
                self.count_restart(i)  # restarted between two chunks, with nothing of it in flight
            self.failing[i] = False
            self.pids[i] = res.pid
            t = time.perf_counter()
            self.learner.insert(res)
            self.timers["learner_insert"] += time.perf_counter() - t
            chunk_seconds = sum(res.timings.values())
            in_process += chunk_seconds
            for key, value in res.timings.items():
                self.timers[key] += value
            self.actor_steps += res.steps
            self.actor_seconds += chunk_seconds
            self.env_steps += res.steps
            self.per_actor[i]["env_steps"] += res.steps
            self.per_actor[i]["episodes"] += len(res.episode_returns)
            for r in res.episode_returns:
                self.episodes.append(dict(env_steps=self.env_steps, actor_id=i, episode_return=r))
        if not self.runtime.in_process:
            self.timers["learner_wait"] += waited
        self.refill()

    def learn(self) -> bool:
        """Run the learner steps the rate limiter allows, up to the next broadcast/evaluation/checkpoint."""
        c = self.config
        owed = self.allowed_updates() - self.learner_steps
        if owed < 1:
            return False
        bounds = [
            owed,
            c.learner_steps - self.learner_steps,
            self.last_broadcast + c.broadcast_every - self.learner_steps,
        ]
        for every in (c.eval_every, c.checkpoint_every):
            if every > 0:
                bounds.append((self.learner_steps // every + 1) * every - self.learner_steps)
        n = max(1, min(bounds))
        sample, update = self.learner.update(n)
        self.timers["learner_sample"] += sample
        self.timers["learner_update"] += update
        self.learner_steps += n
        self.learner.model.num_timesteps = self.env_steps
        if self.learner_steps - self.last_broadcast >= c.broadcast_every:
            self.broadcast()
        if c.eval_every > 0 and self.learner_steps % c.eval_every == 0:
            self.evaluate()
        if c.checkpoint_every > 0 and self.learner_steps % c.checkpoint_every == 0:
            self.save()
        return True

    # --- the loop --------------------------------------------------------------------------------------

    def run(self) -> ActorQResult:
        c = self.config
        arch = self.model_arch
        self.runtime = None
        self.runtime_in_process = c.backend == "local"
        self.timers_at_start = sum(self.timers[k] for k in LEARNER_TIMERS if k != "driver_other")
        self.actor_timers_at_start = sum(self.timers[k] for k in ACTOR_TIMERS)
        timings: dict[str, dict[str, float]] = {}
        if c.actor_backend == "auto" and self.state.get("actor_backend"):  # a resumed run keeps its engine
            backend, timings = self.state["actor_backend"], dict(self.state.get("backend_timings", {}))
        elif c.actor_backend == "auto":
            backend, timings = choose_backend(arch, c.actor_precision, steps_per_load=c.update_period)
        else:
            backend = c.actor_backend
        self.backend, self.backend_timings = backend, timings
        self.evaluator = Evaluator(c, arch, backend)
        self.lead = max(c.max_insert_lead, c.update_period + math.ceil(c.batch_size / c.samples_per_insert))
        self.queued = [0] * c.n_actors
        self.alive = set(range(c.n_actors))
        self.pids: list[int | None] = [None] * c.n_actors
        self.generation = [0] * c.n_actors
        self.failing = [False] * c.n_actors
        self.reseed: dict[int, int] = {}
        self.failing_since: dict[int, float] = {}
        finished = self.learner_steps >= c.learner_steps and self.history  # resumed from a finished run
        try:
            if not finished:
                self.runtime = make_runtime(c, arch, backend, self.incarnation)
                self.run_loop()
        finally:
            self.evaluator.close()
            if self.runtime is not None:
                t = time.perf_counter()
                self.runtime.shutdown()
                self.timers["shutdown"] += time.perf_counter() - t
        return self.result()

    def run_loop(self) -> None:
        """Broadcast, evaluate, and alternate collecting and learning until the budget or a stop."""
        c = self.config
        self.timers["setup"] += time.perf_counter() - self.start
        self.excluded += time.perf_counter() - self.start
        self.broadcast()
        if not self.history:
            self.evaluate()
        self.refill()
        stopped = False
        while self.learner_steps < c.learner_steps and not stopped:
            self.collect(block=self.allowed_updates() - self.learner_steps < 1)
            if self.learn() and self.callback is not None:
                progress = TrainingProgress(
                    self.learner_steps,
                    self.env_steps,
                    self.wall_time(),
                    self.history[-1]["eval_return"] if self.history else None,
                    self.runtime.actors,
                    self.runtime.name,
                )
                stopped = self.callback(progress) is False
        if self.history[-1]["learner_steps"] != self.learner_steps:
            self.evaluate()
        self.count_unseen_deaths()  # after the evaluation: a death just before the end has reached Ray's records
        self.save()

    def per_actor_frame(self) -> pd.DataFrame:
        frame = pd.DataFrame(self.per_actor, columns=[c for c in PER_ACTOR_COLUMNS if c != "env_step_share"])
        frame.insert(2, "env_step_share", frame["env_steps"] / max(self.env_steps, 1))
        return frame.astype({"env_steps": int, "episodes": int, "restarts": int, "lost": bool})

    def result(self) -> ActorQResult:
        c, backend, timings = self.config, self.backend, self.backend_timings
        elapsed = time.perf_counter() - self.start
        frame = pd.DataFrame(self.history, columns=HISTORY_COLUMNS)
        return ActorQResult(
            config=c,
            history=frame,
            breakdown=self.breakdown(elapsed),
            bytes_per_broadcast=self.bytes_per_broadcast,
            elapsed_s=self.elapsed_offset + elapsed,
            wall_time_s=self.wall_time(),
            env_steps=self.env_steps,
            learner_steps=self.learner_steps,
            broadcasts=self.broadcasts,
            actor_backend=engine_label(backend, c.actor_precision),
            backend_timings=timings,
            actor_steps_per_s=self.actor_steps / max(self.actor_seconds, 1e-9),
            actor_restarts=self.restarts,
            actors_lost=self.lost,
            episodes=pd.DataFrame(self.episodes, columns=EPISODE_COLUMNS),
            per_actor=self.per_actor_frame(),
            resumed_from=int(self.state["learner_steps"]) if self.resumed else None,
            checkpoint=self.checkpoint,
            model=self.learner.model,
        )
