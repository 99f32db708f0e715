"""``combo_sparse_quant`` runs: one TD3 training per task, training kind and seed, then its methods deployed.

Each job trains (or resumes) one agent in its own folder ``out/runs/<env id>__<training>__<seed>`` with
checkpoints (:func:`rlq.experiments.gst.train_compressed`) under the callbacks the notebook built (a
compression callback, and with QAT a :class:`rlq.sb3.qat_callback.QATCallback` in the same ``learn``),
then deploys and measures the methods derived from it (:func:`rlq.experiments.combo.methods.deploy_and_measure`).
:func:`train_all` runs the jobs through :func:`rlq.rl.parallel.run_jobs` with a result store in ``out/jobs/``: a resumed notebook loads finished
jobs and continues an interrupted one from its newest checkpoint. A run folder remembers the settings it
was trained with (``combo_job.json``); a job given other settings refuses to resume it rather than mixing
two configurations.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from rlq.core.jsonio import check_settings
from rlq.core.validation import check_positive_int
from rlq.experiments.combo.methods import DERIVED, TRAININGS, check_methods, deploy_and_measure, trainings_for

if TYPE_CHECKING:
    from stable_baselines3.common.callbacks import BaseCallback

JOB_CONFIG = "combo_job.json"
"""The settings a run folder was trained with; a job with other settings refuses to resume it."""


def check_run_config(run_dir: str | Path, config: dict[str, Any]) -> None:
    """Write ``config`` into ``run_dir`` the first time; raise ValueError naming each setting a later job's changes."""
    check_settings(Path(run_dir) / JOB_CONFIG, config, advice="Use a new run folder, or move this one away.")


def train_and_deploy(  # noqa: PLR0913
    training: str,
    env_id: str,
    total_timesteps: int,
    *,
    seed: int,
    run_dir: str | Path,
    methods: Sequence[str],
    hyperparams: dict[str, Any],
    callbacks: Sequence[BaseCallback],
    eval_episodes: int = 5,
    latency_repeats: int = 200,
    latency_rounds: int = 5,
    checkpoint_every: int = 0,
    torch_threads: int | None = None,
    keys: dict[str, Any] | None = None,
    extra_callbacks: list[Any] | None = None,
) -> dict[str, Any]:
    """Return one job's result: ``rows`` (one per derived method, :func:`deploy_and_measure`'s columns plus keys) and ``training``.

    ``training`` is a key of :data:`TRAININGS`; only the ``methods`` it derives (:data:`DERIVED`) are deployed.
    ``callbacks`` are the training's own, built by the caller: its compression callback
    (:class:`~rlq.sb3.compression.CompressionCallback` for dense, :class:`~rlq.sb3.GradualPruningCallback`,
    :class:`~rlq.sb3.GSTCallback`), then, for a QAT training, its :class:`~rlq.sb3.qat_callback.QATCallback`,
    all in one ``learn``. ``extra_callbacks`` run after them (tests interrupt training with one). Picklable,
    for worker processes; ``torch_threads`` sets this process's thread count.
    """
    from rlq.experiments.gst import train_compressed
    from rlq.sb3.settings import callback_settings

    if training not in TRAININGS:
        raise ValueError(f"unknown training {training!r}; choose from {', '.join(TRAININGS)}")
    if torch_threads is not None:
        torch.set_num_threads(check_positive_int("torch_threads", torch_threads))
    compression, qat = _training_callbacks(training, callbacks)
    derived = [m for m in check_methods(methods) if m in DERIVED[training]]
    config = dict(training=training, env_id=env_id, total_timesteps=total_timesteps, seed=seed,
                  hyperparams=hyperparams, callbacks=[callback_settings(c) for c in callbacks])  # fmt: skip
    check_run_config(run_dir, config)
    run = train_compressed(
        TRAININGS[training][0], "TD3", env_id, total_timesteps, seed=seed, hyperparams=hyperparams, run_dir=run_dir,
        checkpoint_every=checkpoint_every, callback=compression, callbacks=[*qat, *(extra_callbacks or [])],
    )  # fmt: skip
    rows = deploy_and_measure(
        run.model, env_id, derived, seed=seed, folder=Path(run_dir) / "deployed",
        qat_bits=qat[0].bits if qat else 4, eval_episodes=eval_episodes, latency_repeats=latency_repeats,
        latency_rounds=latency_rounds,
    )  # fmt: skip
    keys = dict(keys or {"env_id": env_id, "training": training, "seed": seed})
    returns = run.curve["episode_return"].tail(compression.reward_window)
    training_row = {
        **keys,
        "timesteps": int(run.model.num_timesteps),
        "train_wall_time_s": run.wall_time_s,
        "avg_compression_ratio": run.average_compression_ratio,
        "final_train_return": float(returns.mean()) if len(returns) else float("nan"),
        "resumed_from": run.resumed_from,
    }
    extra = {k: training_row[k] for k in ("timesteps", "train_wall_time_s", "avg_compression_ratio")}
    rows = [{"env_id": env_id, "seed": seed, "training": training, **row, **extra} for row in rows]
    return {"keys": keys, "rows": rows, "training": training_row}


def _training_callbacks(training: str, callbacks: Sequence[BaseCallback]) -> tuple[Any, list[Any]]:
    """Return a training's compression callback and its QAT callback (a list of one or none), checked against :data:`TRAININGS`."""
    from rlq.sb3 import GradualPruningCallback, GSTCallback
    from rlq.sb3.compression import CompressionCallback
    from rlq.sb3.qat_callback import QATCallback

    kind, with_qat = TRAININGS[training]
    wanted = {"dense": CompressionCallback, "pruning": GradualPruningCallback, "gst": GSTCallback}[kind]
    compression = [c for c in callbacks if isinstance(c, CompressionCallback)]
    qat = [c for c in callbacks if isinstance(c, QATCallback)]
    fits = (
        len(compression) == 1
        and (
            type(compression[0]) is CompressionCallback
            if kind == "dense"
            else isinstance(compression[0], wanted)
        )
        and len(qat) == int(with_qat)
        and len(callbacks) == 1 + len(qat)
        and callbacks[0] is compression[0]
    )
    if not fits:
        raise ValueError(
            f"training {training!r} takes a {wanted.__name__}{' then a QATCallback' if with_qat else ''}, got "
            f"{[type(c).__name__ for c in callbacks]}"
        )
    return compression[0], qat


def combo_jobs(
    out: str | Path,
    trainings: Mapping[str, Mapping[str, Sequence[BaseCallback]]],
    *,
    hyperparams: Mapping[str, dict[str, Any]],
    methods: Sequence[str],
    seeds: Sequence[int],
    env_timesteps: Mapping[str, int],
    **job: Any,
) -> list[dict[str, Any]]:
    """Return one :func:`train_and_deploy` job per task, seed and needed training (in that nesting).

    ``trainings[env_id][training]`` is the training's callbacks as the caller built them for that task's
    budget ``env_timesteps[env_id]``, and ``hyperparams[env_id]`` its TD3 arguments; each job gets a fresh
    copy of its callbacks. ``job`` holds the arguments every job shares (``eval_episodes``,
    ``checkpoint_every``, ...).
    """
    methods = check_methods(methods)
    needed = trainings_for(methods)
    for env_id in env_timesteps:
        missing = [t for t in needed if t not in trainings.get(env_id, {})]
        if missing or env_id not in hyperparams:
            raise ValueError(
                f"{env_id}: the methods {methods} need trainings {needed} and hyperparams; "
                f"missing {missing or 'hyperparams'}"
            )
    jobs = []
    for env_id, steps in env_timesteps.items():
        steps = check_positive_int(f"env_timesteps[{env_id!r}]", steps)
        for seed in seeds:
            for training in needed:
                # the derived methods are part of the key: a stored result never stands in for other methods
                derived = ",".join(m for m in methods if m in DERIVED[training])
                keys = {"env_id": env_id, "training": training, "seed": seed, "methods": derived}
                jobs.append(dict(
                    training=training, env_id=env_id, total_timesteps=steps, seed=seed, keys=keys,
                    run_dir=job_folder(out, env_id, training, seed), methods=methods,
                    hyperparams=copy.deepcopy(hyperparams[env_id]),
                    callbacks=copy.deepcopy(list(trainings[env_id][training])), **job,
                ))  # fmt: skip
    return jobs


def zoo_td3_settings(env_id: str) -> tuple[int, dict[str, Any]]:
    """Return rl-zoo3's TD3 budget and hyperparameters for ``env_id``, as :func:`train_and_deploy` takes them.

    Read from the installed ``rl_zoo3``'s ``td3.yml`` (:func:`rlq.rl.zoo.zoo_hyperparams`). The zoo's Gaussian
    exploration noise becomes ``action_noise_std`` (so the settings stay JSON, as a run folder records them);
    the replay buffer is capped at the budget, which it never outgrows. Raises
    :class:`rlq.rl.zoo.ZooSettingError` for a task the zoo does not tune TD3 on, or for settings a combo job
    cannot take (parallel environments, non-Gaussian noise).
    """
    from rlq.rl.zoo import ZooSettingError, zoo_hyperparams

    settings = zoo_hyperparams("TD3", env_id)
    if settings.n_envs != 1 or settings.policy != "MlpPolicy":
        raise ZooSettingError(
            f"{settings.source} trains {settings.n_envs} environments with {settings.policy}; "
            "combo jobs train one environment with an MlpPolicy"
        )
    hyperparams = dict(settings.hyperparams)
    if hyperparams.pop("action_noise", None) is not None:
        if settings.noise_type != "normal":
            raise ZooSettingError(
                f"{settings.source} explores with {settings.noise_type} noise; combo jobs take Gaussian noise only"
            )
        hyperparams["action_noise_std"] = settings.noise_std
    hyperparams["buffer_size"] = min(int(hyperparams.get("buffer_size", 1_000_000)), settings.n_timesteps)
    return settings.n_timesteps, hyperparams


def job_folder(out: str | Path, env_id: str, training: str, seed: int) -> Path:
    """Return the run folder of one training: ``out/runs/<env id>__<training>__<seed>``."""
    return Path(out) / "runs" / f"{env_id.replace('/', '_')}__{training}__{seed}"


def measure_latencies(
    methods: pd.DataFrame, out: str | Path, *, repeats: int = 200, rounds: int = 5
) -> pd.DataFrame:
    """Return ``methods`` (:func:`train_all`'s table) with its latency columns measured now, agent by agent.

    Each training's deployed ONNX files are timed beside the dense fp32 reference
    (:func:`rlq.experiments.combo.methods.deployed_latency`) in this one process, after every training has
    finished: with workers still training beside it a 2-core machine inflates ratios (NOTES.md). The table is
    written again as ``out/methods.csv``. ``repeats`` 0 leaves the columns NaN.
    """
    from rlq.experiments.combo.methods import deployed_latency, latency_columns

    table = methods.copy()
    for column, nan in latency_columns({}, "").items():  # every latency column, NaN until timed
        table[column] = nan
    if repeats:
        for (env_id, training, seed), group in table.groupby(["env_id", "training", "seed"], sort=False):
            folder = job_folder(out, env_id, training, int(seed)) / "deployed"
            timings = deployed_latency(folder, list(group["method"]), repeats=repeats, rounds=rounds)
            for index, method in group["method"].items():
                for column, value in latency_columns(timings, method).items():
                    table.loc[index, column] = value
    table.to_csv(Path(out) / "methods.csv", index=False)
    return table


def train_all(
    jobs: Sequence[dict[str, Any]],
    *,
    out: str | Path | None = None,
    workers: int = 1,
    executor: str = "processes",
    ray_address: str | None = None,
    progress: Callable[[str], Any] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return ``(methods table, trainings table)`` of every job: one row per task, seed and method; one per training.

    Jobs run ``workers`` at a time (``executor``, ``ray_address``: :func:`rlq.rl.parallel.run_jobs`); with
    ``out`` each finished job is saved into ``out/jobs/`` (a resumed run loads it) and both tables are written
    as ``out/methods.csv`` and ``out/trainings.csv``. ``progress`` (``print``) gets a line per finished job.
    """
    from rlq.experiments.gst.training_runs import keys_label
    from rlq.rl.parallel import JOBS_FOLDER, run_jobs

    def finished(index: int, result: dict[str, Any]) -> None:
        if progress is not None:
            row = result["training"]
            parts = ", ".join(f"{r['method']} return {r['eval_return']:.1f} at {r['bits_per_weight']:.2f} bits"
                              for r in result["rows"])  # fmt: skip
            progress(
                f"{keys_label(result['keys'])}: {row['timesteps']} steps in {row['train_wall_time_s']:.0f} s; {parts}"
            )

    labels = [keys_label(job["keys"]) for job in jobs]
    results = run_jobs(
        train_and_deploy, jobs, workers=workers, on_result=finished, labels=labels, executor=executor,
        ray_address=ray_address, store=Path(out) / JOBS_FOLDER if out is not None else None,
    )  # fmt: skip
    methods = pd.DataFrame([row for r in results for row in r["rows"]])
    trainings = pd.DataFrame([r["training"] for r in results])
    if out is not None:
        methods.to_csv(Path(out) / "methods.csv", index=False)
        trainings.to_csv(Path(out) / "trainings.csv", index=False)
    return methods, trainings
