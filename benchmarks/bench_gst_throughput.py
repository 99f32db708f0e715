"""Training throughput of SB3 TD3 with GST and with gradual pruning against plain TD3, side by side.

Run: ``.venv/bin/python benchmarks/bench_gst_throughput.py [--steps 2000] [--rounds 20] [--threads 1]``.
Builds one TD3 model per method on HalfCheetah-v5 (SB3's default 400-300 networks), fills the replay
buffer for ``--learning-starts`` random steps, then times ``--steps`` training steps per method (one
gradient update per environment step), interleaved in ``--rounds`` short rounds (the order rotating) so
that load from other processes hits every method alike. Methods:

- ``plain``: TD3, no callback.
- ``gst``: :class:`rlq.sb3.gst.GSTCallback` held in its block-circulant phase (B=4 on the 400x300 layers
  of actor, critics and targets): every forward expands the B-vectors to a dense weight. This is GST's
  most expensive phase.
- ``gst_pruned``: GST after its hand-over (dense weights, 75% masked), the phase GST ends in.
- ``pruning``: :class:`rlq.sb3.pruning.GradualPruningCallback` with its final 90% masks applied from the
  start (a masked weight is recomputed as ``weight_orig * weight_mask`` at every forward).

Prints steps/s per method (total over the rounds) and, per method, the median over rounds of its speed
divided by plain TD3's speed in the same round (paired, so robust to load that changes between rounds);
the issue's target is at most 10% slower.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from rlq.rl.agents import make_model
from rlq.sb3.compression import CompressionCallback
from rlq.sb3.gst import GSTCallback
from rlq.sb3.pruning import GradualPruningCallback

ENV_ID = "HalfCheetah-v5"
HUGE = 10**9  # a schedule this long never leaves its first phase during the benchmark


def callback_for(method: str, learning_starts: int):
    """Return the callback timed for ``method`` (None for plain TD3)."""
    if method == "plain":
        return None
    if method == "gst":
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="timed training steps per method")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds the steps are split into")
    parser.add_argument("--learning-starts", type=int, default=1000, help="random steps before training")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--methods", default="plain,gst,gst_pruned,pruning", help="comma-separated subset of the methods"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    methods = args.methods.split(",")
    print(
        f"TD3 on {ENV_ID}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"{platform.processor() or platform.machine()}; {args.steps} training steps per method after "
        f"{args.learning_starts} random steps, in {args.rounds} interleaved rounds"
    )
    runs = {}
    for method in methods:
        model = make_model(
            "TD3",
            ENV_ID,
            seed=0,
            hyperparams={"learning_starts": args.learning_starts, "action_noise_std": 0.1},
        )
        callback = callback_for(method, args.learning_starts)
        model.learn(args.learning_starts + 10, callback=callback)  # fill the buffer, first updates, compress
        runs[method] = (model, callback, [])
        if isinstance(callback, CompressionCallback):
            print(
                f"  {method:>10}: compression ratio {callback.compression_ratio():.3f}, "
                f"covered {callback.covered_fraction:.3f}"
            )
    chunk = args.steps // args.rounds
    for round_index in range(args.rounds):
        order = methods[round_index % len(methods) :] + methods[: round_index % len(methods)]
        for method in order:
            model, callback, times = runs[method]
            start = time.perf_counter()
            model.learn(chunk, callback=callback, reset_num_timesteps=False)
            times.append(time.perf_counter() - start)
    header = (
        f"{'method':>10} | {'steps/s':>8} | {'min..max per round':>18} | {'vs plain (median of rounds)':>27}"
    )
    print(header)
    print("-" * len(header))
    plain = runs.get("plain", (None, None, None))[2]
    slowdowns = {}
    for method in methods:
        times = runs[method][2]
        rates = [chunk / t for t in times]
        rate = chunk * len(times) / sum(times)
        versus = "n/a"
        if plain is not None and method != "plain":
            ratios = sorted(p / t for p, t in zip(plain, times, strict=True))  # time_plain / time_method
            median = (
                ratios[len(ratios) // 2] if len(ratios) % 2 else sum(ratios[len(ratios) // 2 - 1 :][:2]) / 2
            )
            slowdowns[method] = 1 - median
            versus = f"{median - 1:+.1%} (rounds {ratios[0] - 1:+.0%}..{ratios[-1] - 1:+.0%})"
        print(f"{method:>10} | {rate:>8.1f} | {min(rates):>8.1f}..{max(rates):<8.1f} | {versus:>27}")
    if slowdowns:
        worst = max(slowdowns, key=slowdowns.get)
        verdict = "met" if slowdowns[worst] <= 0.10 else "MISSED"
        print(
            f"target (at most 10% slower than plain TD3): {verdict}; slowest: {worst} ({slowdowns[worst]:.1%} slower)"
        )


if __name__ == "__main__":
    main()
