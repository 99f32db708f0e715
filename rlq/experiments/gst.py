"""GST experiments: the settings, jobs, training runs, tables and headline numbers the GST notebooks share.

What the GST notebooks call, in the order they call it:

- :func:`compression_settings` derives GST's and the pruning baseline's callback settings from a
  notebook's parameters, by one rule for every notebook; :func:`td3_hyperparams` makes TD3's arguments.
- :func:`method_jobs` (one run per task, seed and method) and :func:`sweep_jobs` (GST's knobs swept)
  list the runs; :func:`train_and_evaluate_all` trains them (through :func:`train_and_evaluate` and
  :func:`train_compressed`, with checkpoints and resume) and stacks their tables.
- :func:`method_means`, :func:`compare_methods`, :func:`controller_decisions`, :func:`gst_start_compression`,
  :func:`layers_of`, :func:`sweep_table` and :func:`sweep_numbers` turn the tables into what the notebooks
  show and record.
- :func:`load_classification_data`, :func:`train_classifiers`, :func:`classification_tables`,
  :func:`layer_kinds` and :func:`classification_numbers`: the ResNet-32 comparison of ``gst_classification``.

Their figures are in :mod:`rlq.experiments.figures`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from stable_baselines3.common.callbacks import BaseCallback

from rlq.core.validation import check_positive_int
from rlq.experiments.compare import reward_drop_vs_dense
from rlq.rl.evaluate import EVAL_SEED_OFFSET
from rlq.rl.parallel import run_jobs
from rlq.sb3.compression import CompressionCallback
from rlq.sb3.gst import GSTCallback
from rlq.sb3.pruning import GradualPruningCallback

if TYPE_CHECKING:
    from rlq.vision import ImageData, TrainedClassifier

METHODS = ("dense", "pruning", "gst")
"""The compression methods of the GST notebooks: dense training, Zhu & Gupta's gradual (iterative) pruning, GST."""

PRUNING_START_FRACTION = 0.2
PRUNING_END_FRACTION = 0.8
"""The pruning baseline's window: Zhu & Gupta's schedule rises from 20% to 80% of the training updates (the usual
RL setting, and what the GST paper's iterative-pruning baseline is taken to be; ``/work/shared/papers/gst.md``)."""

MAX_BUFFER_SIZE = 1_000_000
"""TD3's replay buffer (TD3 paper: 1M); :func:`td3_hyperparams` never makes it larger than the run's steps."""

LOG_POINTS = 200
"""History rows a GST run logs between its schedule's events (``log_every`` is ``total_timesteps // LOG_POINTS``)."""


# --------------------------------------------------------------------------------------------------------
# Settings: one rule for every GST notebook


def compression_settings(
    total_timesteps: int,
    *,
    prune_updates: int,
    max_sparsity: float,
    sparsity_step: float,
    reward_tolerance: float,
    sparsity_backoff: float,
    block_schedule: Sequence[Sequence[float]],
    bc_end: float,
    s_shift: float | None = None,
    transition_method: str | None = None,
    reward_abs_tolerance: float = 0.0,
    learning_starts: int = 0,
) -> dict[str, dict[str, Any]]:
    """Return ``{"gst": ..., "pruning": ...}``: the settings of :class:`GSTCallback` and :class:`GradualPruningCallback`.

    One rule for every GST notebook, from its parameters:

    - GST updates its reward-aware target every ``total_timesteps // prune_updates`` environment steps, and
      its target is capped at ``max_sparsity``, rising by ``sparsity_step`` while the windowed reward stays
      within ``reward_tolerance`` (relative) or ``reward_abs_tolerance`` (absolute) of its best, falling by
      ``sparsity_backoff`` when it drops. ``s_shift`` and ``transition_method`` are left out when None (a
      sweep sets them per run).
    - The pruning baseline reaches ``max_sparsity`` (the same final sparsity as GST's cap) over
      :data:`PRUNING_START_FRACTION` to :data:`PRUNING_END_FRACTION` of the training updates, that is of the
      ``total_timesteps - learning_starts`` steps after an off-policy algorithm's random warm-up (0 for
      on-policy PPO and A2C), in ``prune_updates`` updates.

    The two count their updates differently for off-policy runs: GST's interval counts the warm-up steps,
    the baseline's does not (so with TD3, GST makes fewer than ``prune_updates`` target updates). Both are
    kept as the published runs used them: counting GST's over the training updates too would change
    ``gst_td3_mujoco``'s numbers.
    """
    total_timesteps = check_positive_int("total_timesteps", total_timesteps)
    prune_updates = check_positive_int("prune_updates", prune_updates)
    if not 0 <= learning_starts < total_timesteps:
        raise ValueError(f"learning_starts must be in [0, total_timesteps), got {learning_starts}")
    gst: dict[str, Any] = {
        "block_schedule": [tuple(pair) for pair in block_schedule],
        "bc_end": bc_end,
        "prune_every": max(1, total_timesteps // prune_updates),
        "sparsity": {
            "max_sparsity": max_sparsity,
            "step_size": sparsity_step,
            "tolerance": reward_tolerance,
            "abs_tolerance": reward_abs_tolerance,
            "backoff": sparsity_backoff,
        },
    }
    if s_shift is not None:
        gst["s_shift"] = s_shift
    if transition_method is not None:
        gst["transition_method"] = transition_method
    # rounded: 0.8 - 0.2 is 0.6000000000000001 in floats, and the window must be exactly 0.6 of the updates
    window = round(PRUNING_END_FRACTION - PRUNING_START_FRACTION, 9)
    pruning = {
        "final_sparsity": max_sparsity,
        "start_fraction": PRUNING_START_FRACTION,
        "end_fraction": PRUNING_END_FRACTION,
        "update_every": max(1, int(window * (total_timesteps - learning_starts)) // prune_updates),
    }
    return {"gst": gst, "pruning": pruning}


def td3_hyperparams(
    total_timesteps: int,
    *,
    learning_starts: int,
    batch_size: int,
    action_noise_std: float,
    net_arch: Sequence[int],
) -> dict[str, Any]:
    """Return TD3's arguments: Gaussian action noise, hidden widths, and a buffer no larger than the run's steps.

    The buffer never holds more than ``total_timesteps`` transitions (at most :data:`MAX_BUFFER_SIZE`), so
    checkpoints of short runs stay small.
    """
    return {
        "learning_starts": learning_starts,
        "batch_size": batch_size,
        "action_noise_std": action_noise_std,
        "buffer_size": min(MAX_BUFFER_SIZE, total_timesteps),
        "policy_kwargs": {"net_arch": list(net_arch)},
    }


# --------------------------------------------------------------------------------------------------------
# Jobs: which runs a notebook trains


def method_jobs(
    out: str | Path,
    *,
    methods: Sequence[str],
    seeds: Sequence[int],
    env_ids: Sequence[str],
    total_timesteps: int,
    settings: dict[str, dict[str, Any]],
    label_env: bool = False,
    log_points: int = LOG_POINTS,
    **job: Any,
) -> list[dict[str, Any]]:
    """Return one :func:`train_and_evaluate` job per task, seed and method (in that nesting), each in its own folder.

    ``settings`` is :func:`compression_settings`'s result; ``job`` holds the arguments every run shares
    (``algo``, ``n_envs``, ``hyperparams``, ``eval_episodes``, ...). A run's folder is
    ``out/runs/<method>__<seed>``, with ``label_env`` ``out/runs/<env id>__<method>__<seed>`` and the env id
    among the ``keys`` columns of its tables (else ``seed`` and ``method`` only).
    """
    jobs = []
    for env_id in env_ids:
        for seed in seeds:
            for method in methods:
                keys = (
                    {"env_id": env_id, "seed": seed, "method": method}
                    if label_env
                    else {"seed": seed, "method": method}
                )
                folder = f"{env_id}__{method}__{seed}" if label_env else f"{method}__{seed}"
                jobs.append(
                    dict(
                        method=method,
                        env_id=env_id,
                        total_timesteps=total_timesteps,
                        seed=seed,
                        keys=keys,
                        run_dir=Path(out) / "runs" / folder,
                        gst=settings["gst"],
                        pruning=settings["pruning"],
                        log_every=max(1, total_timesteps // log_points),
                        **job,
                    )
                )
    return jobs


def sweep_label(transition: str, s_shift: float) -> str:
    """Return the name of one swept GST configuration, e.g. ``"exact, S_shift 0.25"``."""
    return f"{transition}, S_shift {s_shift:g}"


def sweep_jobs(
    out: str | Path,
    *,
    seeds: Sequence[int],
    s_shifts: Sequence[float],
    transition_methods: Sequence[str],
    include_dense: bool,
    env_id: str,
    total_timesteps: int,
    settings: dict[str, dict[str, Any]],
    log_points: int = 100,
    **job: Any,
) -> list[dict[str, Any]]:
    """Return one :func:`train_and_evaluate` job per seed and configuration: dense, then GST per transition and S_shift.

    Each GST run takes ``settings["gst"]`` with its own ``s_shift`` and ``transition_method``; the tables'
    ``keys`` are ``seed``, ``method``, ``config`` (:func:`sweep_label`, or ``"dense"``), ``s_shift`` and
    ``transition``.
    """
    configs: list[tuple[str, float | None, str | None]] = [("dense", None, None)] if include_dense else []
    configs += [("gst", s, t) for t, s in itertools.product(transition_methods, s_shifts)]
    jobs = []
    for seed in seeds:
        for method, shift, transition in configs:
            config = "dense" if method == "dense" else sweep_label(transition, shift)
            gst = (
                {**settings["gst"], "s_shift": shift, "transition_method": transition}
                if method == "gst"
                else None
            )
            jobs.append(
                dict(
                    method=method,
                    env_id=env_id,
                    total_timesteps=total_timesteps,
                    seed=seed,
                    keys={
                        "seed": seed,
                        "method": method,
                        "config": config,
                        "s_shift": shift,
                        "transition": transition,
                    },
                    run_dir=Path(out) / "runs" / f"{config.replace(', ', '__').replace(' ', '_')}__{seed}",
                    gst=gst,
                    log_every=max(1, total_timesteps // log_points),
                    **job,
                )
            )
    return jobs


# --------------------------------------------------------------------------------------------------------
# One training run per method, with checkpoints


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


def train_compressed(
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
) -> CompressedRun:
    """Return a run of ``algo`` on ``env_id`` trained with compression ``method`` (see :func:`make_callback`).

    Training goes through :func:`rlq.rl.agents.train_agent` with compressed checkpoints
    (:func:`rlq.sb3.checkpoint.save_compressed`) every ``checkpoint_every`` steps into ``run_dir``; calling
    it again with the same ``run_dir`` resumes from the newest checkpoint, schedule state included.
    ``callbacks`` run after the compression callback (e.g. live progress in :mod:`rlq.faces.widgets`);
    ``env_kwargs`` go to every env made (:func:`rlq.rl.envs.make_vec_env`).
    """
    from rlq.rl.agents import train_agent
    from rlq.sb3.checkpoint import load_compressed, save_compressed

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


def train_and_evaluate(
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
    ``keys`` itself is returned too. Picklable, so
    :func:`rlq.rl.parallel.run_jobs` can run it in worker processes; ``torch_threads`` sets the thread count
    of the process that trains.
    """
    from rlq.rl.evaluate import evaluate

    if torch_threads is not None:
        torch.set_num_threads(check_positive_int("torch_threads", torch_threads))
    run = train_compressed(method, algo, env_id, total_timesteps, seed=seed, **train_kwargs)
    keys = dict(keys or {})
    summary = {**keys, **run.summary(last_episodes=last_episodes)}
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
        "summary": summary,
        "history": run.history.assign(**keys),
        "curve": run.curve.assign(**keys),
        "events": run.callback.events.assign(**keys),
        "layers": run.callback.layer_report().assign(**keys),
    }


RUN_TABLES = ("summary", "history", "curve", "events")
"""Tables :func:`train_and_evaluate_all` gathers over runs and writes as CSV (``layers`` stays per run)."""


def train_and_evaluate_all(
    jobs: Sequence[dict[str, Any]],
    *,
    workers: int = 1,
    out: str | Path | None = None,
    on_result: Callable[[int, dict[str, Any]], None] | None = None,
    tables: Sequence[str] = RUN_TABLES,
    progress: Callable[[str], Any] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, pd.DataFrame]]:
    """Return every run's result and the runs' tables stacked (:data:`RUN_TABLES`), after training them all.

    Runs :func:`train_and_evaluate` on each job (keyword arguments) in ``workers`` processes through
    :func:`rlq.rl.parallel.run_jobs`, calling ``on_result(index, result)`` as each finishes. ``summary`` has
    one row per run; the other tables stack every run's rows (each carries its job's ``keys`` columns).
    ``tables`` picks which of them to gather. With ``out``, each is also written to ``out/<name>.csv``:
    the top-level CSVs of a run folder are what ``rlq publish`` commits. ``progress`` (``print`` in a
    notebook) gets one line per finished run (:func:`run_line`), in the order runs finish.
    """
    unknown = sorted(set(tables) - set(RUN_TABLES))
    if unknown:
        raise ValueError(f"unknown table(s) {unknown}; the tables of a run are {list(RUN_TABLES)}")

    def finished(index: int, result: dict[str, Any]) -> None:
        if progress is not None:
            progress(run_line(result))
        if on_result is not None:
            on_result(index, result)

    results = run_jobs(train_and_evaluate, jobs, workers=workers, on_result=finished)
    stacked: dict[str, pd.DataFrame] = {}
    for name in tables:
        if name == "summary":
            stacked[name] = pd.DataFrame([r["summary"] for r in results])
        else:
            stacked[name] = (
                pd.concat([r[name] for r in results], ignore_index=True) if results else pd.DataFrame()
            )
    if out is not None:
        for name, table in stacked.items():
            table.to_csv(Path(out) / f"{name}.csv", index=False)
    return results, stacked


def run_line(result: dict[str, Any]) -> str:
    """Return one finished run (a :func:`train_and_evaluate` result) as a line: its keys, compression, returns, time."""
    row = result["summary"]
    label = ", ".join(f"{k} {v}" for k, v in result.get("keys", {}).items() if v is not None)
    parts = [f"average compression {row['avg_compression_ratio']:.3f}"]
    if "eval_return" in row:
        parts.append(f"evaluation return {row['eval_return']:.2f}")
    parts.append(f"last training episodes {row['final_train_return']:.2f}")
    parts.append(f"{row['wall_time_s']:.0f} s")
    if row.get("resumed_from"):
        parts.append(f"resumed from step {row['resumed_from']}")
    return f"{label}: " + ", ".join(parts)


# --------------------------------------------------------------------------------------------------------
# Tables and headline numbers

SUMMARY_MEANS = (
    "avg_compression_ratio",
    "final_compression_ratio",
    "covered_fraction",
    "eval_return",
    "final_train_return",
)
"""Summary columns :func:`method_means` averages over seeds (``eval_return`` only when the runs were evaluated)."""


def score_column(summary: pd.DataFrame) -> str:
    """Return the column that scores a run: ``eval_return`` when the runs were evaluated, else ``final_train_return``."""
    return "eval_return" if "eval_return" in summary.columns else "final_train_return"


def method_means(summary: pd.DataFrame, by: Sequence[str] = ("method",)) -> pd.DataFrame:
    """Return the mean over seeds of each method's :data:`SUMMARY_MEANS` columns, one row per ``by`` group (in run order)."""
    columns = [c for c in SUMMARY_MEANS if c in summary.columns]
    return summary.groupby(list(by), sort=False)[columns].mean()


def _method_mean(means: pd.DataFrame, method: str, column: str) -> float | None:
    """Return ``method``'s value of ``column`` in :func:`method_means`'s table, or None when it was not run."""
    return float(means.loc[method, column]) if method in means.index else None


def compare_methods(
    summary: pd.DataFrame, score: str | None = None, score_name: str = "final_return"
) -> dict[str, Any]:
    """Return one task's headline numbers: each method's average compression and score, GST against pruning and dense.

    ``summary`` holds the task's runs (one row per seed and method); ``score`` is the column that scores a
    run (default :func:`score_column`), recorded as ``<score_name>_<method>``. GST's "no reward drop" is judged
    against seed noise by :func:`rlq.experiments.compare.reward_drop_vs_dense`. A method that was not run
    gives None.
    """
    score = score or score_column(summary)
    means = method_means(summary)
    compression = {m: _method_mean(means, m, "avg_compression_ratio") for m in METHODS}
    gst, pruning = compression["gst"], compression["pruning"]
    versus_dense = reward_drop_vs_dense(
        *(summary.loc[summary["method"] == m, score].tolist() for m in ("dense", "gst"))
    )
    return {
        **{f"avg_compression_{m}": compression[m] for m in METHODS},
        "gap_gst_minus_pruning_pp": 100 * (gst - pruning) if None not in (gst, pruning) else None,
        **{f"{score_name}_{m}": _method_mean(means, m, score) for m in METHODS},
        "reward_change_gst_vs_dense_pct": versus_dense["change_pct"],
        "seed_std_pct_of_dense": versus_dense["seed_std_pct"],
        "reward_drop_beyond_seed_noise_pct": versus_dense["drop_beyond_noise_pct"],
        "covered_fraction": _method_mean(means, "gst", "covered_fraction"),
    }


def layers_of(results: Sequence[dict[str, Any]], method: str = "gst") -> pd.DataFrame | None:
    """Return the layer table (kind, block size, stored and dense weights) of the first run of ``method``, or None."""
    return next((r["layers"] for r in results if r["summary"]["method"] == method), None)


def gst_start_compression(summary: pd.DataFrame) -> float | None:
    """Return the lowest compression ratio GST runs start training with (block-circulant from step 0), or None."""
    start = summary.loc[summary["method"] == "gst", "start_compression_ratio"]
    return float(start.min()) if len(start) else None


def controller_decisions(history: pd.DataFrame) -> dict[str, int]:
    """Return how often GST's reward-aware controller took each decision (rise, backoff, ...) at its pruning updates."""
    gst = history[history["method"] == "gst"]
    updates = gst[gst["decision"].notna() & (gst["event"] != "log")]
    return {str(k): int(v) for k, v in updates["decision"].value_counts().items()}


def sweep_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Return the GST runs of a sweep averaged over seeds, one row per (transition, S_shift)."""
    gst = summary[summary["method"] == "gst"]
    return gst.groupby(["transition", "s_shift"])[
        ["avg_compression_ratio", "final_compression_ratio", "eval_return", "final_train_return"]
    ].mean()


def transition_shifts(events: pd.DataFrame) -> pd.Series:
    """Return the mean relative weight shift at the block-size transitions, per transition method."""
    return events[events["kind"] == "transition"].groupby("transition")["mean_shift"].mean()


def sweep_numbers(table: pd.DataFrame, summary: pd.DataFrame, events: pd.DataFrame) -> dict[str, Any]:
    """Return a sweep's headline numbers: average compression and return per configuration, the best, the dense return."""
    dense = summary.loc[summary["method"] == "dense", "eval_return"]
    best = table["avg_compression_ratio"].idxmax()
    return {
        "avg_compression": {
            sweep_label(t, s): float(v) for (t, s), v in table["avg_compression_ratio"].items()
        },
        "eval_return": {sweep_label(t, s): float(v) for (t, s), v in table["eval_return"].items()},
        "dense_eval_return": float(dense.mean()) if len(dense) else None,
        "best_config": sweep_label(*best),
        "best_avg_compression": float(table["avg_compression_ratio"].max()),
        "transition_shift": {str(k): float(v) for k, v in transition_shifts(events).items()},
    }


# --------------------------------------------------------------------------------------------------------
# Classification: dense, pruning and GST on ResNet-32 (gst_classification)


def load_classification_data(
    cifar10_path: str,
    *,
    digits_size: int,
    max_train_images: int,
    max_test_images: int,
    val_size: float,
    seed: int,
) -> ImageData:
    """Return CIFAR-10 from ``cifar10_path`` (sklearn's digits offline when it is empty), subsampled, with a validation split.

    GST's reward is the validation accuracy, so the test images never steer training.
    """
    from rlq.vision import load_cifar10, load_digits_images

    data = (
        load_cifar10(cifar10_path) if cifar10_path else load_digits_images(image_size=digits_size, seed=seed)
    )
    return data.subset(max_train_images, max_test_images, seed=seed).with_validation(val_size, seed=seed)


def train_classifiers(
    data: ImageData,
    methods: Sequence[str],
    *,
    epochs: int,
    batch_size: int,
    width: int,
    seed: int,
    out: str | Path,
    schedule: dict[str, Any],
    progress: Callable[[str], Any] | None = None,
    **train: Any,
) -> dict[str, TrainedClassifier]:
    """Return one ResNet-32 trained per method, each from the same initial weights and resumable from its checkpoints.

    ``schedule`` holds :func:`rlq.vision.make_schedule`'s knobs, ``train`` :func:`rlq.vision.train_classifier`'s
    (``lr``, ``weight_decay``, ``device``, ...). Checkpoints go to ``out/checkpoints/<method>/``; ``progress``
    gets one line per trained method.
    """
    from rlq.vision import make_schedule, resnet32, train_classifier

    steps_per_epoch = data.steps_per_epoch(batch_size)
    results = {}
    for method in methods:
        torch.manual_seed(seed)  # the same initial weights for every method
        model = resnet32(num_classes=data.num_classes, width=width, in_channels=data.image_shape[0])
        results[method] = result = train_classifier(
            model,
            data,
            epochs,
            batch_size=batch_size,
            schedule=make_schedule(method, epochs * steps_per_epoch, steps_per_epoch, **schedule),
            seed=seed,
            method=method,
            checkpoint_dir=Path(out) / "checkpoints" / method,
            **train,
        )
        if progress is not None:
            last = result.history.iloc[-1]
            resumed = f", resumed from epoch {result.resumed_from}" if result.resumed_from else ""
            progress(
                f"{method:8s} test accuracy {100 * last.test_accuracy:.2f}%  compression final "
                f"{100 * last.compression_ratio:.1f}% / average {100 * last.avg_compression_ratio:.1f}%  "
                f"({result.wall_time_s:.0f} s{resumed})"
            )
    return results


def classification_tables(
    results: dict[str, TrainedClassifier], out: str | Path | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return every method's per-epoch history stacked, and one summary row per method; with ``out``, also as CSVs."""
    from rlq.vision import summarize

    history = pd.concat([r.history for r in results.values()], ignore_index=True)
    summary = summarize(history)
    if out is not None:
        history.to_csv(Path(out) / "history.csv", index=False)
        summary.to_csv(Path(out) / "summary.csv", index=False)
    return history, summary


def layer_kinds(model: torch.nn.Module) -> pd.DataFrame:
    """Return a network's layers grouped by kind (dense, block-circulant, pruned): how many, stored and dense weights."""
    from rlq.compress import layer_report

    layers = pd.DataFrame(layer_report(model))
    return layers.groupby("kind").agg(
        layers=("name", "count"), stored=("stored", "sum"), dense=("dense", "sum")
    )


def classification_numbers(
    summary: pd.DataFrame, data: ImageData, *, epochs: int, steps: int, width: int
) -> dict[str, Any]:
    """Return a classification run's headline numbers: the data, then per method accuracy and compression (in %)."""
    numbers: dict[str, Any] = {
        "dataset": data.name,
        "data_source": data.source,
        "epochs": epochs,
        "steps": steps,
        "width": width,
    }
    for row in summary.itertuples():
        numbers[f"{row.method}_test_accuracy"] = row.test_accuracy
        numbers[f"{row.method}_final_compression"] = row.final_compression
        numbers[f"{row.method}_avg_compression"] = row.avg_compression
        numbers[f"{row.method}_wall_time_s"] = row.wall_time_s
        if "accuracy_drop_vs_dense" in summary.columns:
            numbers[f"{row.method}_accuracy_drop_vs_dense"] = row.accuracy_drop_vs_dense
    return numbers
