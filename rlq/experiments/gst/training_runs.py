"""GST training runs: one run per compression method (dense, pruning, GST), with checkpoints, evaluated and tabled."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from stable_baselines3.common.callbacks import BaseCallback

from rlq.core.jsonio import check_settings, plain_json, read_json, write_json
from rlq.core.validation import check_positive_int
from rlq.experiments.run_folders import RESULTS_FILE
from rlq.rl.evaluate import EVAL_SEED_OFFSET
from rlq.rl.parallel import JOBS_FOLDER, JobFailure, JobsFailed, run_jobs
from rlq.sb3.compression import CompressionCallback
from rlq.sb3.gst_callback import GSTCallback
from rlq.sb3.pruning_callback import GradualPruningCallback

METHODS = ("dense", "pruning", "gst")
"""The compression methods of the GST notebooks: dense training, Zhu & Gupta's gradual (iterative) pruning, GST."""

SETTINGS_FILE = "run_settings.json"
"""What a run's training was built with (:func:`run_settings`' ``training``), in its folder; a job built
otherwise refuses to resume the folder."""
RETRAIN_ADVICE = (
    "Train it into a new run folder (another `out`; in JupyterLab a restarted kernel's run_dir() is a new one), "
    "or move this folder away to train it again here."
)
"""What a refused job's error tells its reader to do."""


@dataclass
class CompressedRun:
    """One training run with a compression method, as the GST notebooks use it."""

    method: str
    model: Any
    callback: CompressionCallback
    curve: pd.DataFrame
    wall_time_s: float
    resumed_from: int | None

    @property
    def history(self) -> pd.DataFrame:
        """Return the callback's history (see :data:`HISTORY_COLUMNS`)."""
        return self.callback.history

    @property
    def average_compression_ratio(self) -> float:
        """Return the compression ratio averaged over the training updates."""
        return self.callback.average_compression_ratio()

    def summary(self, last_episodes: int = 10) -> dict[str, Any]:
        """Return the run's headline numbers as one table row.

        ``final_train_return`` is the mean return of the last ``last_episodes`` training episodes.
        """
        history = self.history
        returns = self.curve["episode_return"].tail(last_episodes)
        return {
            "method": self.method,
            "timesteps": int(self.model.num_timesteps),
            "avg_compression_ratio": self.average_compression_ratio,
            "start_compression_ratio": float(history["compression_ratio"].iloc[0]),
            "final_compression_ratio": float(history["compression_ratio"].iloc[-1]),
            "covered_fraction": self.callback.covered_fraction,
            "final_train_return": float(returns.mean()) if len(returns) else float("nan"),
            "episodes": len(self.curve),
            "wall_time_s": self.wall_time_s,
        }


def make_callback(
    method: str,
    gst: dict[str, Any] | None = None,
    pruning: dict[str, Any] | None = None,
    reward_window: int = 10,
    log_every: int = 1000,
) -> CompressionCallback:
    """Return the callback of ``method``: ``"dense"`` (records only), ``"pruning"`` or ``"gst"``.

    ``gst`` holds :class:`GSTCallback`'s settings (GSTConfig fields), ``pruning`` those of
    :class:`GradualPruningCallback` (``final_sparsity`` required).
    """
    common = dict(reward_window=reward_window, log_every=log_every)
    if method == "dense":
        return CompressionCallback(**common)
    if method == "gst":
        return GSTCallback(**common, **(gst or {}))
    if method == "pruning":
        settings = dict(pruning or {})
        if "final_sparsity" not in settings:
            raise ValueError("the pruning method needs pruning={'final_sparsity': ...}")
        return GradualPruningCallback(**settings, **common)
    raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")


def train_compressed(  # noqa: PLR0913
    method: str,
    algo: str,
    env_id: str,
    total_timesteps: int,
    *,
    seed: int = 0,
    n_envs: int = 1,
    hyperparams: dict[str, Any] | None = None,
    policy: str | None = None,
    run_dir: str | Path | None = None,
    checkpoint_every: int = 0,
    gst: dict[str, Any] | None = None,
    pruning: dict[str, Any] | None = None,
    reward_window: int = 10,
    log_every: int = 1000,
    callbacks: list[BaseCallback] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    callback: CompressionCallback | None = None,
) -> CompressedRun:
    """Return a run of ``algo`` on ``env_id`` trained with compression ``method`` (see :func:`make_callback`).

    ``callback``, when given, is the compression callback itself (a fresh one, built by the caller) and
    ``method`` only names it; ``gst``, ``pruning``, ``reward_window`` and ``log_every`` are then unused.

    Training goes through :func:`rlq.rl.agents.train_agent` with compressed checkpoints
    (:func:`rlq.sb3.checkpoint.save_compressed`) every ``checkpoint_every`` steps into ``run_dir``; calling
    it again with the same ``run_dir`` resumes from the newest checkpoint, schedule state included.
    ``callbacks`` run after the compression callback (e.g. live progress in :mod:`rlq.faces.widgets`);
    ``env_kwargs`` go to every env made (:func:`rlq.rl.envs.make_vec_env`).
    """
    from rlq.rl.agents import train_agent
    from rlq.sb3.checkpoint import load_compressed, save_compressed

    if callback is None:
        callback = make_callback(method, gst, pruning, reward_window, log_every)
    result = train_agent(
        algo,
        env_id,
        total_timesteps,
        seed=seed,
        n_envs=n_envs,
        hyperparams=hyperparams,
        run_dir=run_dir,
        checkpoint_every=checkpoint_every,
        callback=[callback, *(callbacks or [])],
        policy=policy,
        save_model=save_compressed,
        load_model=load_compressed,
        env_kwargs=env_kwargs,
    )
    if callback.layers is None:  # a finished run resumed: learn() did not run, attach the model for measures
        callback.init_callback(result.model)
    return CompressedRun(
        method, result.model, callback, result.curve, result.wall_time_s, result.resumed_from
    )


TRAINING_ARGUMENTS = (
    "algo",
    "env_id",
    "total_timesteps",
    "seed",
    "n_envs",
    "hyperparams",
    "policy",
    "env_kwargs",
)
"""The arguments of :func:`train_compressed` that shape a training run (its callback's knobs are added)."""
EVALUATION_ARGUMENTS = ("eval_episodes", "eval_seed", "eval_deterministic", "last_episodes")
"""The arguments of :func:`train_and_evaluate` that shape a run's evaluation and summary."""


def _defaults(func: Callable[..., Any]) -> dict[str, Any]:
    parameters = inspect.signature(func).parameters.items()
    return {name: p.default for name, p in parameters if p.default is not inspect.Parameter.empty}


def run_settings(job: Mapping[str, Any]) -> dict[str, Any]:
    """Return what a :func:`train_and_evaluate` job (its keyword arguments) builds its run with, as JSON data.

    ``training``: the algorithm, task, steps, seed, environments, hyperparameters, policy and the
    compression callback's knobs (:func:`rlq.sb3.settings.callback_settings`); ``evaluation``: the
    evaluation episodes, their seed and mode, and the training episodes the summary averages. How a run
    executes (threads, checkpoints, folders, extra callbacks) is not part of it.
    """
    from rlq.sb3.settings import callback_settings

    args = {**_defaults(train_compressed), **_defaults(train_and_evaluate), **job}
    callback = args["callback"]
    if callback is None:
        callback = make_callback(
            args["method"], args["gst"], args["pruning"], args["reward_window"], args["log_every"]
        )
    if args["eval_seed"] is None:
        args["eval_seed"] = args["seed"] + EVAL_SEED_OFFSET
    training = {name: args[name] for name in TRAINING_ARGUMENTS} | {"callback": callback_settings(callback)}
    return plain_json(
        {"training": training, "evaluation": {name: args[name] for name in EVALUATION_ARGUMENTS}}
    )


def _same_settings(job: dict[str, Any], saved: Any) -> bool:
    """Return True when a saved result was built as ``job`` builds its run (or says nothing of its settings)."""
    built = saved.get("settings") if isinstance(saved, dict) else None
    return built is None or built == run_settings(job)


def train_and_evaluate(  # noqa: PLR0913
    method: str,
    algo: str,
    env_id: str,
    total_timesteps: int,
    *,
    seed: int = 0,
    eval_episodes: int = 5,
    eval_seed: int | None = None,
    torch_threads: int | None = None,
    keys: dict[str, Any] | None = None,
    last_episodes: int = 10,
    eval_deterministic: bool = True,
    **train_kwargs: Any,
) -> dict[str, Any]:
    """Return one run's tables as plain data: ``summary`` (a row), ``history``, ``curve``, ``events``, ``layers``.

    :func:`train_compressed` (same arguments; it resumes from ``run_dir``) followed by a deterministic
    evaluation (``eval_deterministic``) of ``eval_episodes`` episodes (seeded ``eval_seed``, default ``seed +
    EVAL_SEED_OFFSET``; 0 episodes skips it); ``last_episodes`` training episodes make the summary's
    ``final_train_return``. Every table carries the ``keys`` columns (e.g. env id, seed, method), and
    ``keys`` itself is returned too, with ``settings``, what the run was built with (:func:`run_settings`).
    A ``run_dir`` records the training's settings (:data:`SETTINGS_FILE`) and a later call built otherwise
    (a changed callback knob, hyperparameter, step count, ...) raises ValueError naming each difference
    instead of resuming it; a folder without the file records the settings of the first call that uses it.
    Picklable, so
    :func:`rlq.rl.parallel.run_jobs` can run it in worker processes; ``torch_threads`` sets the thread count
    of the process that trains.
    """
    from rlq.rl.evaluate import evaluate

    if torch_threads is not None:
        torch.set_num_threads(check_positive_int("torch_threads", torch_threads))
    settings = run_settings(
        dict(method=method, algo=algo, env_id=env_id, total_timesteps=total_timesteps, seed=seed,
             eval_episodes=eval_episodes, eval_seed=eval_seed, last_episodes=last_episodes,
             eval_deterministic=eval_deterministic, **train_kwargs)
    )  # fmt: skip
    if train_kwargs.get("run_dir") is not None:
        check_settings(
            Path(train_kwargs["run_dir"]) / SETTINGS_FILE, settings["training"], advice=RETRAIN_ADVICE
        )
    run = train_compressed(method, algo, env_id, total_timesteps, seed=seed, **train_kwargs)
    keys = dict(keys or {})
    # the keys name the run (an ablation arm trains method "gst" under its own name): they win
    summary = {**keys, **{k: v for k, v in run.summary(last_episodes=last_episodes).items() if k not in keys}}
    if eval_episodes:
        result = evaluate(
            run.model,
            env_id,
            n_episodes=eval_episodes,
            seed=seed + EVAL_SEED_OFFSET if eval_seed is None else eval_seed,
            deterministic=eval_deterministic,
            **(train_kwargs.get("env_kwargs") or {}),  # the environment the run trained on
        )
        summary |= {"eval_return": result.mean, "eval_std": result.std}
    summary |= {"resumed_from": run.resumed_from}
    return {
        "keys": keys,
        "settings": settings,
        "summary": summary,
        "history": run.history.assign(**keys),
        "curve": run.curve.assign(**keys),
        "events": run.callback.events.assign(**keys),
        "layers": run.callback.layer_report().assign(**keys),
    }


RUN_TABLES = ("summary", "history", "curve", "events")
"""Tables :func:`train_and_evaluate_all` gathers over runs and writes as CSV (``layers`` stays per run)."""


def train_and_evaluate_all(  # noqa: PLR0913
    jobs: Sequence[dict[str, Any]],
    *,
    workers: int = 1,
    out: str | Path | None = None,
    on_result: Callable[[int, dict[str, Any]], None] | None = None,
    tables: Sequence[str] = RUN_TABLES,
    progress: Callable[[str], Any] | None = None,
    executor: str = "processes",
    ray_address: str | None = None,
    resources: dict[str, float] | None = None,
    allow_failed: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, pd.DataFrame]]:
    """Return every run's result and the runs' tables stacked (:data:`RUN_TABLES`), after training them all.

    Runs :func:`train_and_evaluate` on each job (keyword arguments), ``workers`` at a time, in processes or on
    Ray (``executor``, ``ray_address``, ``resources``: see :func:`rlq.rl.parallel.run_jobs`), calling
    ``on_result(index, result)`` as each finishes. With ``out``, each run's result is saved in ``out/jobs/``
    as it arrives and a resumed notebook loads it instead of training again, if it was built with the
    job's settings (:func:`run_settings`): a result evaluated otherwise is evaluated again from the run's
    checkpoint, and a run trained otherwise is refused (:func:`train_and_evaluate`), so changed knobs never
    come back as the old method's numbers. A failed run does not stop the
    others; ``results.json`` in ``out`` lists the failed runs under ``failed_jobs`` and, unless
    ``allow_failed`` (then the results and tables hold only the runs that finished), :class:`JobsFailed`
    is raised once the others are done, so the run fails and ``rlq run --resume`` retrains only those. ``summary`` has
    one row per run; the other tables stack every run's rows (each carries its job's ``keys`` columns).
    ``tables`` picks which of them to gather. With ``out``, each is also written to ``out/<name>.csv``:
    the top-level CSVs of a run folder are what ``rlq publish`` commits. ``progress`` (``print`` in a
    notebook) gets one line per finished run (:func:`run_line`), in the order runs finish. Live bars come
    on their own (:mod:`rlq.core.progress`), each run named by its ``keys`` (:func:`keys_label`).
    """
    unknown = sorted(set(tables) - set(RUN_TABLES))
    if unknown:
        raise ValueError(f"unknown table(s) {unknown}; the tables of a run are {list(RUN_TABLES)}")

    def finished(index: int, result: dict[str, Any]) -> None:
        if progress is not None:
            progress(run_line(result))
        if on_result is not None:
            on_result(index, result)

    labels = [keys_label(job.get("keys") or {}) or f"job {i + 1}" for i, job in enumerate(jobs)]
    outcome = run_jobs(
        train_and_evaluate, jobs, workers=workers, on_result=finished, labels=labels, executor=executor,
        ray_address=ray_address, resources=resources, store=Path(out) / JOBS_FOLDER if out is not None else None,
        on_error="keep", keep_saved=_same_settings,
    )  # fmt: skip
    if out is not None:
        record_failed_jobs(out, outcome.failures)
    if outcome.failures and not allow_failed:
        raise JobsFailed(outcome.failures, len(jobs))
    results = [r for r in outcome if r is not None]
    stacked: dict[str, pd.DataFrame] = {}
    for name in tables:
        if name == "summary":
            stacked[name] = pd.DataFrame([r["summary"] for r in results])
        else:
            stacked[name] = _stack([r[name] for r in results])
    if out is not None:
        for name, table in stacked.items():
            table.to_csv(Path(out) / f"{name}.csv", index=False)
    return results, stacked


def _stack(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Return ``frames`` stacked as pandas 2 does now: a dense run's empty event table and all-NA columns (its
    block size) take no part in the dtypes, so the committed CSVs keep their formats (pandas warns that a later
    version will change this; the warning is for us, not for a notebook's reader)."""
    if not frames:
        return pd.DataFrame()
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="The behavior of DataFrame concatenation", category=FutureWarning
        )
        return pd.concat(frames, ignore_index=True)


def record_failed_jobs(out: str | Path, failures: Sequence[JobFailure]) -> None:
    """Write the failed runs (label, keys, error) into ``out/results.json`` as ``failed_jobs`` (none: ``[]``).

    Written when runs failed, or to clear an earlier attempt's list; the rest of results.json is kept.
    """
    path = Path(out) / RESULTS_FILE
    results = read_json(path) if path.is_file() else {}
    if failures or "failed_jobs" in results:
        results["failed_jobs"] = [f.as_dict() for f in failures]
        write_json(path, results)


def run_line(result: dict[str, Any]) -> str:
    """Return one finished run (a :func:`train_and_evaluate` result) as a line: its keys, compression, returns, time."""
    row = result["summary"]
    label = keys_label(result.get("keys", {}))
    parts = [f"average compression {row['avg_compression_ratio']:.3f}"]
    if "eval_return" in row:
        parts.append(f"evaluation return {row['eval_return']:.2f}")
    parts.append(f"last training episodes {row['final_train_return']:.2f}")
    parts.append(f"{row['wall_time_s']:.0f} s")
    if row.get("resumed_from"):
        parts.append(f"resumed from step {row['resumed_from']}")
    return f"{label}: " + ", ".join(parts)


def keys_label(keys: dict[str, Any]) -> str:
    """Return a run's ``keys`` as its name in progress lines and bars, e.g. ``"seed 0, method gst"``."""
    return ", ".join(f"{k} {v}" for k, v in keys.items() if v is not None)
