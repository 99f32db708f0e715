"""Where the actors run: in the driver process (``local``) or as Ray actors (``ray``), behind one interface.

Both runtimes take chunk requests (``submit``: actor ``i``, ``n`` steps) and hand back finished chunks
(``wait``). The local runtime runs the requested chunks one after the other, in actor order, when asked
for results: deterministic, and every second is spent in this process. The Ray runtime starts one Ray
actor per ActorQ actor (restarted by Ray up to ``max_actor_restarts`` times) and a small policy-store
actor; the broadcaster ``ray.put``s each blob into the object store and hands the store its reference;
actors pull it from there.

``health()`` tells how often each actor died, whether or not the driver has heard from it since: the
training loop notices a death only when it next collects from that actor, so it asks at the end of a run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlq.actorq.actor import ActorWorker, ChunkResult, Exploration, LocalPolicyStore
from rlq.actorq.architecture import PolicyArchitecture
from rlq.actorq.config import ActorQConfig

log = logging.getLogger(__name__)


def actor_seed(config: ActorQConfig, actor_id: int, incarnation: int = 0) -> int:
    """Return the seed of actor ``actor_id``'s environment and noise (a new one after each restart or resume)."""
    return int(config.seed) * 1_000_003 + 7919 * (actor_id + 1) + 104_729 * incarnation


def actor_kwargs(
    config: ActorQConfig, arch: PolicyArchitecture, backend: str, actor_id: int, incarnation: int
):
    """Return the constructor arguments of actor ``actor_id``."""
    random_steps = -(-config.learning_starts // config.n_actors) if incarnation == 0 else 0
    return dict(
        actor_id=actor_id,
        env_id=config.env_id,
        arch=arch,
        precision=config.actor_precision,
        backend=backend,
        seed=actor_seed(config, actor_id, incarnation),
        exploration=Exploration(config.exploration_noise, random_steps),
    )


class ActorFailure(Exception):
    """A Ray actor's chunk failed; ``permanent`` when the actor is dead for good."""

    def __init__(self, actor_id: int, error: BaseException, permanent: bool):
        super().__init__(f"actor {actor_id}: {type(error).__name__}: {error}")
        self.actor_id, self.error, self.permanent = actor_id, error, permanent


@dataclass(frozen=True)
class ActorHealth:
    """What a runtime knows of one actor's deaths."""

    restarts: int
    """Times the actor died and was started again."""
    dead: bool
    """Whether it is dead for good (out of restarts)."""


class LocalRuntime:
    """All actors in this process, run in turn (one torch thread each, as the paper's actors)."""

    name = "local"
    in_process = True
    depth = 1

    def __init__(self, config: ActorQConfig, arch: PolicyArchitecture, backend: str, incarnation: int = 0):
        self.store = LocalPolicyStore()
        self.workers = [
            ActorWorker(**actor_kwargs(config, arch, backend, i, incarnation)) for i in range(config.n_actors)
        ]
        self.pending: list[tuple[int, int, int | None]] = []

    @property
    def actors(self) -> list[Any]:
        """Return the actor objects (here the :class:`ActorWorker` instances themselves)."""
        return list(self.workers)

    def publish(self, blob: bytes, version: int) -> None:
        """Make ``blob`` the latest policy."""
        self.store.publish(blob, version)

    def submit(self, actor_id: int, n_steps: int, reseed: int | None = None) -> None:
        """Ask actor ``actor_id`` for ``n_steps`` transitions."""
        self.pending.append((actor_id, n_steps, reseed))

    def health(self) -> list[ActorHealth]:
        """Return every actor's deaths: none, in-process actors live as long as this process."""
        return [ActorHealth(0, False) for _ in self.workers]

    def wait(self, block: bool = True) -> list[tuple[int, ChunkResult | ActorFailure]]:
        """Return the submitted chunks, run now one after the other."""
        from rlq.quant.latency import torch_threads

        done = []
        with torch_threads(1):
            for actor_id, n_steps, reseed in self.pending:
                done.append((actor_id, self.workers[actor_id].run(n_steps, self.store, reseed)))
        self.pending = []
        return done

    def shutdown(self) -> None:
        """Close the actors' environments."""
        for worker in self.workers:
            worker.close()


class _PolicyStoreActor:
    """Holds the object reference of the latest broadcast (a Ray actor with no CPU of its own)."""

    def __init__(self) -> None:
        self.version, self.ref = -1, None

    def publish(self, version: int, boxed_ref: list) -> None:
        self.version, self.ref = version, boxed_ref[0]

    def latest(self, have_version: int) -> list | None:
        # The reference travels boxed in a list so that Ray hands it over instead of resolving it here.
        if self.ref is None or self.version <= have_version:
            return None
        return [self.version, [self.ref]]


class RayStoreClient:
    """What a Ray actor pulls through: asks the store for a newer version, then fetches the blob."""

    def __init__(self, store_handle) -> None:
        self.store = store_handle

    def pull(self, have_version: int) -> tuple[int, np.ndarray] | None:
        import ray

        got = ray.get(self.store.latest.remote(have_version))
        if got is None:
            return None
        version, (ref,) = got
        return version, ray.get(ref)  # a read-only view of the object store's copy, no deserialization


def ray_init_kwargs(num_cpus: int | None = None, address: str | None = None) -> dict[str, Any]:
    """Return the arguments of ``ray.init``: quiet, no dashboard; ``address`` joins a cluster, else ``num_cpus`` CPUs."""
    kwargs: dict[str, Any] = dict(
        include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False, configure_logging=True
    )
    if address is not None:
        return {"address": address, **kwargs}
    return {"num_cpus": num_cpus or os.cpu_count() or 1, **kwargs}


@contextlib.contextmanager
def ray_session(num_cpus: int | None = None, address: str | None = None) -> Iterator[Any]:
    """Yield the ``ray`` module with Ray running: started here unless it already runs, and then shut down on exit.

    Several :func:`rlq.actorq.train` calls inside one ``with ray_session()`` block share its Ray instance
    (Ray's start-up, 12-15 s here, is paid once).
    """
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(**ray_init_kwargs(num_cpus, address))
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


class RayRuntime:
    """One Ray actor per ActorQ actor; joins a running Ray (or ``ray_address``) or starts a local one."""

    name = "ray"
    in_process = False
    depth = 2  # chunks queued per actor, so an actor never waits for the driver to ask again

    def __init__(self, config: ActorQConfig, arch: PolicyArchitecture, backend: str, incarnation: int = 0):
        import ray

        self.started_ray = False
        if not ray.is_initialized():
            ray.init(**ray_init_kwargs(config.ray_num_cpus, config.ray_address))
            self.started_ray = True
        self._ray = ray
        self.handles: list[Any] = []
        self.store = None
        self.inflight: dict[Any, int] = {}
        # The processes each actor has been seen in: how health() tells restarts where the GCS cannot.
        self.pids: list[set[int]] = []
        self._blob_ref = None
        try:
            self.store = ray.remote(num_cpus=0)(_PolicyStoreActor).remote()
            self.client = RayStoreClient(self.store)
            remote_worker = ray.remote(ActorWorker).options(
                max_restarts=config.max_actor_restarts, max_task_retries=0
            )
            for i in range(config.n_actors):
                kwargs = actor_kwargs(config, arch, backend, i, incarnation)
                self.handles.append(remote_worker.remote(**kwargs, set_threads=True))
            # Start-up (a process per actor importing torch and the environment) is setup, not training.
            _, *pids = ray.get([self.store.latest.remote(0)] + [h.ping.remote() for h in self.handles])
            self.pids = [{pid} for pid in pids]
        except BaseException:
            self.shutdown()
            raise

    @property
    def actors(self) -> list[Any]:
        """Return the Ray actor handles (``ray.kill(handle, no_restart=False)`` makes Ray restart one)."""
        return list(self.handles)

    def publish(self, blob: bytes, version: int) -> None:
        """Put ``blob`` into the object store and tell the store actor its reference."""
        ref = self._ray.put(np.frombuffer(blob, dtype=np.uint8))
        published = self.store.publish.remote(version, [ref])
        if self._blob_ref is None:
            # Actors ask the store from their own processes: the first policy must be there before they start.
            # Later publishes from this one caller reach the store in order and need no wait.
            self._ray.get(published)
        self._blob_ref = ref

    def submit(self, actor_id: int, n_steps: int, reseed: int | None = None) -> None:
        """Queue a chunk of ``n_steps`` on Ray actor ``actor_id``."""
        ref = self.handles[actor_id].run.remote(n_steps, self.client, reseed)
        self.inflight[ref] = actor_id

    def wait(self, block: bool = True) -> list[tuple[int, ChunkResult | ActorFailure]]:
        """Return every finished chunk (at least one when ``block``), failures as :class:`ActorFailure`."""
        ray = self._ray
        if not self.inflight:
            return []
        refs = list(self.inflight)
        ready, _ = ray.wait(refs, num_returns=1, timeout=None if block else 0)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        done = []
        for ref in ready:
            actor_id = self.inflight.pop(ref)
            try:
                result = ray.get(ref)
                self.pids[actor_id].add(result.pid)
                done.append((actor_id, result))
            except ray.exceptions.ActorUnavailableError as e:  # restarting: Ray brings it back
                done.append((actor_id, ActorFailure(actor_id, e, permanent=False)))
            except ray.exceptions.RayActorError as e:  # dead and out of restarts (ActorDiedError)
                done.append((actor_id, ActorFailure(actor_id, e, permanent=True)))
        return done

    def health(self, timeout_s: float = 10.0) -> list[ActorHealth]:
        """Return every actor's restarts and whether it is dead for good, heard from since or not.

        Read from Ray's control store (GCS), which counts each restart once and waits for no actor. Where that
        table cannot be read (a private Ray API), each actor is pinged instead (for at most ``timeout_s``): a
        restart then shows as a process id not seen before, or as an actor that is restarting right now, so
        several deaths between two chunks of one actor count as one.
        """
        try:
            from ray._private.state import actors

            infos = [actors(actor_id=handle._actor_id.hex()) for handle in self.handles]
            return [ActorHealth(int(info["NumRestarts"]), info["State"] == "DEAD") for info in infos]
        except Exception as e:  # noqa: BLE001 -- any change of the private API falls back to pings
            log.debug("Ray's actor table is unreadable (%s); pinging the actors instead", e)
        return self._health_by_ping(timeout_s)

    def _health_by_ping(self, timeout_s: float) -> list[ActorHealth]:
        ray = self._ray
        refs = [handle.ping.remote() for handle in self.handles]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        health = []
        for ref, seen in zip(refs, self.pids, strict=True):
            dead = restarting = False
            if ref in ready:
                try:
                    seen.add(ray.get(ref))
                except ray.exceptions.ActorDiedError:
                    dead = True
                except ray.exceptions.RayActorError:  # unavailable: restarting
                    restarting = True
            health.append(ActorHealth(len(seen) - 1 + restarting, dead))
        return health

    def drop(self, actor_id: int) -> None:
        """Forget a dead actor's queued chunks."""
        for ref, owner in list(self.inflight.items()):
            if owner == actor_id:
                del self.inflight[ref]

    def shutdown(self) -> None:
        """Kill the actors and the store; shut Ray down if this runtime started it."""
        ray = self._ray
        try:
            for handle in [*self.handles, *([self.store] if self.store is not None else [])]:
                try:
                    ray.kill(handle, no_restart=True)
                except Exception:  # already dead
                    pass
        finally:
            self.inflight.clear()
            if self.started_ray:
                ray.shutdown()


def make_runtime(config: ActorQConfig, arch: PolicyArchitecture, backend: str, incarnation: int = 0):
    """Return the runtime ``config.backend`` names, with its actors started."""
    cls = RayRuntime if config.backend == "ray" else LocalRuntime
    start = time.perf_counter()
    runtime = cls(config, arch, backend, incarnation)
    log.debug(
        "%s runtime with %d actors up in %.1f s", runtime.name, config.n_actors, time.perf_counter() - start
    )
    return runtime
