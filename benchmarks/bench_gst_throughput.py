"""Training throughput of SB3 TD3 with GST, GST plus QAT and gradual pruning against plain TD3, side by side.

Run: ``.venv/bin/python benchmarks/bench_gst_throughput.py [--steps 2000] [--rounds 20] [--threads 1]``
on a quiet machine (load below 1; the header prints it). Builds one TD3 model per method on
HalfCheetah-v5 (SB3's default 400-300 networks), fills the replay buffer for ``--learning-starts`` random
steps, then times ``--steps`` training steps per method (one gradient update per environment step),
interleaved in ``--rounds`` short rounds (the order rotating) so that load from other processes hits every
method alike. Methods:

- ``plain``: TD3, no callback.
- ``gst``: :class:`rlq.sb3.gst_callback.GSTCallback` held in its block-circulant phase (B=4 on the 400x300 layers
  of actor, critics and targets): forwards use the dense expansion of the B-vectors, recomputed whenever
  they changed (:class:`rlq.compress.expansion_cache.ExpansionCache`). GST's most expensive phase.
- ``gst_torch``: ``gst`` with rlq's compiled kernels switched off (:func:`use_kernels`): expansion and
  gradient sums by PyTorch ops, as when rlq is installed without a C compiler.
- ``gst_pruned``: GST after its hand-over (dense weights, 75% masked), the phase GST ends in.
- ``gst_qat``: ``gst`` plus :class:`rlq.sb3.qat_callback.QATCallback` (4 bits, ``delay_steps=0``) in the same
  ``learn``: every weight of every network fake-quantized on top of the compression, once per value it
  takes (:class:`rlq.sb3.qat_stacking.MemoizedWeightFakeQuant`; no conversion between rounds, which are one
  training run cut into pieces).
- ``gst_qat_torch``: ``gst_qat`` with the compiled kernels switched off (fake quantization by PyTorch ops too).
- ``gst_qat_actor``: as ``gst_qat`` with ``QATCallback(networks="action_path")``: only the actor and its
  target (what is deployed) are fake-quantized; the twin critics and their targets train in float.
- ``pruning``: :class:`rlq.sb3.pruning_callback.GradualPruningCallback` with its final 90% masks applied from the
  start (a masked weight is recomputed as ``weight_orig * weight_mask`` at every forward); no target, the
  baseline GST is compared with.

Prints steps/s per method (total over the rounds) and, per method, the paired ratio of each round
(plain TD3's time over the method's time in the same round, so robust to load that changes between
rounds): its median over rounds with a bootstrap 95% interval (rounds resampled with replacement,
``--bootstrap`` times, fixed seed). Targets (issue 16): GST in both phases at most 10% slower than plain
TD3 (ratio at least 0.90), GST plus QAT (either scope) at most 15% slower (at least 0.85). A target is "met" only when
the interval's worst end is within it, "missed" when even its best end is beyond it, else "inconclusive"
(run more rounds).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
import torch

from rlq.compress import circulant
from rlq.core.cpu import cpu_model
from rlq.quant import tensor as quant_tensor
from rlq.rl.agents import make_model
from rlq.sb3.compression import CompressionCallback
from rlq.sb3.gst_callback import GSTCallback
from rlq.sb3.pruning_callback import GradualPruningCallback
from rlq.sb3.qat_callback import QATCallback

ENV_ID = "HalfCheetah-v5"
HUGE = 10**9  # a schedule this long never leaves its first phase during the benchmark
METHODS = ("plain", "gst", "gst_torch", "gst_pruned", "gst_qat", "gst_qat_torch", "gst_qat_actor", "pruning")
MAX_SLOWDOWN = {
    "gst": 0.10,
    "gst_torch": 0.10,
    "gst_pruned": 0.10,
    "gst_qat": 0.15,
    "gst_qat_torch": 0.15,
    "gst_qat_actor": 0.15,
}
"""Issue 16's targets: at most this fraction slower than plain TD3 (a paired ratio of at least 1 - it)."""


def callback_for(method: str, learning_starts: int):
    """Return the callback (or list of callbacks) timed for ``method`` (None for plain TD3)."""
    if method == "plain":
        return None
    if method in ("gst_qat", "gst_qat_torch", "gst_qat_actor"):
        # converting at the end of each round's learn would end QAT after the first round
        networks = "action_path" if method == "gst_qat_actor" else "all"
        qat = QATCallback(4, delay_steps=0, convert_at_end=False, networks=networks)
        return [qat, callback_for("gst", learning_starts)]
    if method in ("gst", "gst_torch"):
        return GSTCallback(
            total_steps=HUGE, block_schedule=((0.0, 4),), bc_end=1.0, s_shift=1.0, log_every=HUGE
        )
    if method == "gst_pruned":
        # hand-over at step 1: the kept-ratio hand-over from B=4 masks 75% of the dense weights
        return GSTCallback(
            total_steps=HUGE, block_schedule=((0.0, 4),), bc_end=1 / HUGE, prune_every=HUGE, log_every=HUGE
        )
    if method == "pruning":
        return GradualPruningCallback(
            0.9, start_fraction=0.0, end_fraction=0.0, total_steps=HUGE, log_every=HUGE
        )
    raise ValueError(method)


def use_kernels(on: bool) -> None:
    """Switch rlq's compiled kernels (block-circulant expansion and gradient, fake quantization) on or off."""
    circulant.USE_KERNELS = on
    quant_tensor.USE_KERNELS = on


def paired_ratios(plain: list[float], times: list[float]) -> np.ndarray:
    """Return each round's plain TD3 time over the method's time in the same round (above 1: faster)."""
    return np.asarray(plain, dtype=float) / np.asarray(times, dtype=float)


def bootstrap_median(ratios: np.ndarray, reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Return the median of ``ratios`` and a bootstrap 95% interval of it (rounds resampled with replacement)."""
    ratios = np.asarray(ratios, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(ratios[rng.integers(0, len(ratios), size=(reps, len(ratios)))], axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(np.median(ratios)), float(low), float(high)


def verdict(low: float, high: float, max_slowdown: float) -> str:
    """Return "met" when even the interval's worst end is within the target, "missed" when its best end is not."""
    floor = 1.0 - max_slowdown
    if low >= floor:
        return "met"
    if high < floor:
        return "missed"
    return "inconclusive"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="timed training steps per method")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds the steps are split into")
    parser.add_argument("--learning-starts", type=int, default=1000, help="random steps before training")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples of the rounds")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of the methods")
    args = parser.parse_args()
    args.methods = args.methods.split(",")
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    return args


def prepared_runs(methods: list[str], learning_starts: int) -> dict[str, tuple[Any, Any, list[float]]]:
    """Return each method's TD3 model and callback after the random steps and first updates, with an empty
    list for its timed rounds."""
    runs = {}
    for method in methods:
        model = make_model(
            "TD3",
            ENV_ID,
            seed=0,
            hyperparams={"learning_starts": learning_starts, "action_noise_std": 0.1},
        )
        callback = callback_for(method, learning_starts)
        use_kernels(not method.endswith("_torch"))
        model.learn(learning_starts + 10, callback=callback)  # fill the buffer, first updates, compress
        runs[method] = (model, callback, [])
        for part in callback if isinstance(callback, list) else [callback]:
            if isinstance(part, CompressionCallback):
                print(
                    f"  {method:>13}: compression ratio {part.compression_ratio():.3f}, "
                    f"covered {part.covered_fraction:.3f}"
                )
    return runs


def time_rounds(runs: dict[str, tuple[Any, Any, list[float]]], rounds: int, chunk: int) -> None:
    """Train every method ``chunk`` steps per round, the order rotating each round; append each round's time."""
    methods = list(runs)
    for round_index in range(rounds):
        order = methods[round_index % len(methods) :] + methods[: round_index % len(methods)]
        for method in order:
            model, callback, times = runs[method]
            use_kernels(not method.endswith("_torch"))
            start = time.perf_counter()
            model.learn(chunk, callback=callback, reset_num_timesteps=False)
            times.append(time.perf_counter() - start)


def print_table(runs: dict[str, tuple[Any, Any, list[float]]], chunk: int, bootstrap: int) -> None:
    """Print each method's steps/s and its paired ratio to plain TD3 against its target."""
    header = (
        f"{'method':>13} | {'steps/s':>8} | {'min..max per round':>18} | "
        f"{'plain/method: median [95% CI]':>30} | {'rounds':>13} | target"
    )
    print(header)
    print("-" * len(header))
    plain = runs["plain"][2] if "plain" in runs else None
    for method, (_, _, times) in runs.items():
        rates = [chunk / t for t in times]
        rate = chunk * len(times) / sum(times)
        versus, spread, target = "n/a", "", ""
        if plain is not None and method != "plain":
            ratios = paired_ratios(plain, times)
            median, low, high = bootstrap_median(ratios, bootstrap)
            versus = f"{median:.3f} [{low:.3f}, {high:.3f}]"
            spread = f"{ratios.min():.2f}..{ratios.max():.2f}"
            if method in MAX_SLOWDOWN:
                limit = MAX_SLOWDOWN[method]
                target = f"<= {limit:.0%} slower (>= {1 - limit:.2f}): {verdict(low, high, limit)}"
            else:
                target = "none (baseline)"
        print(
            f"{method:>13} | {rate:>8.1f} | {min(rates):>8.1f}..{max(rates):<8.1f} | {versus:>30} | "
            f"{spread:>13} | {target}"
        )


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if not (circulant.kernels_available() and quant_tensor.kernels_available()):
        print("rlq was installed without its compiled kernels: the *_torch methods time the same code")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"TD3 on {ENV_ID}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"{cpu_model()}, load {load:.2f}; {args.steps} training steps per "
        f"method after {args.learning_starts} random steps, in {args.rounds} interleaved rounds"
    )
    runs = prepared_runs(args.methods, args.learning_starts)
    chunk = args.steps // args.rounds
    time_rounds(runs, args.rounds, chunk)
    print_table(runs, chunk, args.bootstrap)
    print(
        "plain/method: plain TD3's time over the method's in the same round (1.0 = as fast, 0.9 = 10% slower); "
        f"median over {args.rounds} rounds, bootstrap 95% interval ({args.bootstrap} resamples, seed 0)"
    )


if __name__ == "__main__":
    main()
