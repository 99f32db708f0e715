"""Latency of compiled compressed policies (rlq.deploy) against ONNX Runtime and PyTorch, side by side, by batch.

Models (random weights; latency does not depend on their values): ``17-W-W-W-6`` MLPs, HalfCheetah's
observation and action sizes, ReLU between layers and tanh at the end, for W in the width sweep; and TD3's
``17-400-300-6`` actor. Compression sits where GST puts it, on the hidden W x W layers (the first and last
layers stay dense int8): block-circulant with each B, or 16x4-block sparse at each sparsity; 8-bit storage
(``compile_policy(..., "int8")``: int8 codes, inputs quantized per row). The references run the dense model
of the same width: ONNX Runtime int8 (dynamic quantization, full graph optimisation, one thread), ONNX
Runtime fp32 and PyTorch fp32, one thread.

Each policy is called on one observation at a time: ``tight``, back to back on observations of HalfCheetah-v5;
``env``, interleaved with a MuJoCo ``env.step`` of HalfCheetah-v5 between calls (the policy's caches
cooled by the simulator), timing the policy call only. Every round times every policy in turn (so drift
hits all alike); a round's p50 and p99 are over its calls, and the table shows their median over rounds,
and each policy's p50 ratio to ONNX Runtime int8 dense of the same width (higher is faster). ``weight KiB``:
the bytes of weights, scales, indices and tables one call reads (dense references: int8 or fp32 weights and
their scales and biases).

With ``--batches 1 8 64`` every policy is also timed back to back on batches of that many observations
(one call per batch, the same rounds): the table gives each call's p50, its cost per row, the per-row
gain over the same policy at batch 1 (``row gain``: p50 at batch 1 over p50 per row at the batch, higher
means the batch shares more) and the p50 ratio to ONNX Runtime int8 dense at the same batch. The header
names the CPU (from ``/proc/cpuinfo``): the ratios belong to it. Run:

    .venv/bin/python benchmarks/bench_compressed_policy.py            # several minutes on 2 cores
    .venv/bin/python benchmarks/bench_compressed_policy.py --widths 2048 --blocks 16 --sparsities 0.9 --batches 1 8 64
    .venv/bin/python benchmarks/bench_compressed_policy.py --quick    # a smoke run, well under a minute
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlq.compress import block_circulant_
from rlq.compress.masks import prune_with_mask_
from rlq.core.cpu import cpu_model
from rlq.deploy import compile_policy, kernels_available
from rlq.quant import OnnxPolicy, export_onnx

OBS, ACT, ENV_ID = 17, 6, "HalfCheetah-v5"
REFERENCE = "ORT int8 dense"
SPARSE_BLOCK = (16, 4)


@dataclass
class Policy:
    """One callable to time: its name, the bytes one call reads, and per-round p50 / p99 in microseconds."""

    name: str
    call: Callable[[np.ndarray], np.ndarray]
    weight_bytes: int
    tight: list[tuple[float, float]] = field(default_factory=list)
    env: list[tuple[float, float]] = field(default_factory=list)
    batched: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    """Per-round p50 / p99 of one call on a batch, by batch size (batch 1: ``tight``)."""


def mlp(widths: list[int], seed: int = 0) -> nn.Sequential:
    """Return a ReLU MLP of the given widths ending in tanh, float32, with seeded random weights."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for n_in, n_out in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(n_in, n_out), nn.ReLU()]
    return nn.Sequential(*layers[:-1], nn.Tanh()).eval()


def dense_bytes(model: nn.Module, value_bytes: int) -> int:
    """Return the weight bytes a dense backend reads: values at ``value_bytes``, a float scale per layer, biases."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return sum(
        m.weight.numel() * value_bytes + 4 * m.out_features + (4 if value_bytes == 1 else 0) for m in linears
    )


def block_sparse_(model: nn.Sequential, sparsity: float, seed: int = 0) -> nn.Sequential:
    """Prune every hidden layer of ``model`` to ``sparsity`` in random 16x4 blocks (edge blocks cut), in place."""
    rng = np.random.default_rng(seed)
    rows, cols = SPARSE_BLOCK
    linears = [m for m in model if isinstance(m, nn.Linear)]
    for layer in linears[1:-1]:
        out, inp = layer.out_features, layer.in_features
        keep = rng.random((-(-out // rows), -(-inp // cols))) >= sparsity
        mask = np.kron(keep, np.ones(SPARSE_BLOCK, dtype=np.float32))[:out, :inp]
        prune_with_mask_(layer, "weight", torch.from_numpy(np.ascontiguousarray(mask)))
    return model


def references(model: nn.Module, folder: Path, tag: str) -> list[Policy]:
    """Return the dense references: ONNX Runtime int8 and fp32, and PyTorch fp32, of ``model``."""
    example = torch.zeros(1, OBS)
    policies = []
    for precision, label in (("int8", REFERENCE), ("fp32", "ORT fp32 dense")):
        session = OnnxPolicy(export_onnx(model, folder / f"{tag}-{precision}.onnx", example, precision))
        run, names, key = session.session.run, session.output_names, session.input_name
        policies.append(
            Policy(label, lambda x, run=run, names=names, key=key: run(names, {key: x})[0],
                   dense_bytes(model, 1 if precision == "int8" else 4))
        )  # fmt: skip

    def torch_call(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model(torch.from_numpy(x)).numpy()

    return [*policies, Policy("torch fp32 dense", torch_call, dense_bytes(model, 4))]


def compiled(name: str, model: nn.Module, precision: str = "int8", **options) -> Policy:
    """Return an rlq.deploy policy compiled from ``model``."""
    policy = compile_policy(model, precision, **options)
    return Policy(name, policy, policy.weight_bytes)


def width_policies(width: int, blocks: list[int], sparsities: list[float], folder: Path) -> list[Policy]:
    """Return the references and the compiled policies of the ``17-W-W-W-6`` MLP."""
    widths = [OBS, width, width, width, ACT]
    dense = mlp(widths)
    policies = [*references(dense, folder, f"w{width}"), compiled("rlq dense int8", dense)]
    for b in blocks:
        model = mlp(widths)
        block_circulant_(model, b)
        policies.append(compiled(f"rlq circulant B={b} int8", model))
        if b == 16:
            policies.append(compiled(f"rlq circulant B={b} fp32", model, "fp32"))
    for s in sparsities:
        policies.append(compiled(f"rlq {s:.0%} 16x4-sparse int8", block_sparse_(mlp(widths), s)))
    return policies


def td3_policies(folder: Path) -> list[Policy]:
    """Return the references and the compiled policies of TD3's 17-400-300-6 actor: dense, block-circulant (B = 4
    divides 400 and 300) and its 400x300 layer pruned to 90% in 16x4 blocks (as GST with ``prune_block`` leaves it)."""
    widths = [OBS, 400, 300, ACT]
    dense = mlp(widths)
    circulant = mlp(widths)
    block_circulant_(circulant, 4)
    return [
        *references(dense, folder, "td3"),
        compiled("rlq dense fp32", dense, "fp32"),
        compiled("rlq dense int8", dense),
        compiled("rlq circulant B=4 int8", circulant),
        compiled(TD3_SPARSE, block_sparse_(mlp(widths), 0.9)),
    ]


def percentiles(times_ns: list[int]) -> tuple[float, float]:
    return float(np.percentile(times_ns, 50)) / 1e3, float(np.percentile(times_ns, 99)) / 1e3


def time_tight(policy: Policy, observations: np.ndarray, calls: int) -> tuple[float, float]:
    """Return p50 and p99 (us) of ``calls`` back-to-back calls on the observations in turn."""
    times = []
    for i in range(calls):
        x = observations[i % len(observations)]
        start = time.perf_counter_ns()
        policy.call(x)
        times.append(time.perf_counter_ns() - start)
    return percentiles(times)


def time_with_env(policy: Policy, env: gym.Env, calls: int) -> tuple[float, float]:
    """Return p50 and p99 (us) of ``calls`` calls, each after an ``env.step`` with the previous action."""
    obs, _ = env.reset(seed=0)
    times = []
    for _ in range(calls):
        x = np.asarray(obs, np.float32)[None]
        start = time.perf_counter_ns()
        action = policy.call(x)
        times.append(time.perf_counter_ns() - start)
        obs, _, terminated, truncated, _ = env.step(np.asarray(action, np.float64)[0])
        if terminated or truncated:
            obs, _ = env.reset()
    return percentiles(times)


def calls_for(policy: Policy, observations: np.ndarray, budget_s: float, lo: int, hi: int) -> int:
    """Return how many calls fit ``budget_s`` seconds for this policy (after a warm-up), within [lo, hi]."""
    start = time.perf_counter()
    for i in range(10):
        policy.call(observations[i % len(observations)])
    per_call = (time.perf_counter() - start) / 10
    return int(min(hi, max(lo, budget_s / max(per_call, 1e-7))))


def visited_observations(env: gym.Env, n: int) -> np.ndarray:
    """Return ``n`` float32 observations of ``env`` under random actions, from 8 seeded episodes."""
    rows = []
    for seed in range(8):
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        for _ in range(n // 8):
            rows.append(np.asarray(obs, np.float32))
            obs, *_ = env.step(env.action_space.sample())
    return np.stack(rows)


def measure(
    groups: dict[str, list[Policy]], rounds: int, budget_s: float, lo: int, hi: int, batches: list[int]
) -> None:
    """Time every policy of every group, ``rounds`` times, in turn; results land in the policies.

    Batch 1 is timed back to back and with ``env.step``; every other batch in ``batches`` back to back, one
    call per batch of distinct observations, cycling through 8 batches.
    """
    env = gym.make(ENV_ID)
    visited = visited_observations(env, 8 * max([64, *batches]))
    inputs = {b: visited[: 8 * b].reshape(8, b, OBS) for b in batches if b > 1}
    inputs[1] = visited[:64, None]
    policies = [p for ps in groups.values() for p in ps]
    calls = {(id(p), b): calls_for(p, x, budget_s, lo, hi) for p in policies for b, x in inputs.items()}
    for _ in range(rounds):
        for p in policies:
            p.tight.append(time_tight(p, inputs[1], calls[id(p), 1]))
            p.env.append(time_with_env(p, env, calls[id(p), 1]))
            for b, x in inputs.items():
                if b > 1:
                    p.batched.setdefault(b, []).append(time_tight(p, x, calls[id(p), b]))
    env.close()


def summary(rows: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)


def print_group(title: str, policies: list[Policy]) -> dict[str, tuple[float, float]]:
    """Print one group's table; return each policy's p50 ratio to the reference, tight and with env.step."""
    ref = next(p for p in policies if p.name == REFERENCE)
    ref_tight, ref_env = summary(ref.tight)[0], summary(ref.env)[0]
    print(f"\n{title}")
    header = f"{'policy':<28} {'weight KiB':>10} | {'p50 us':>8} {'p99 us':>8} {'vs ORT int8':>11}"
    print(f"{header} | {'p50 us':>8} {'p99 us':>8} {'vs ORT int8':>11}")
    print(f"{'':<28} {'':>10} | {'tight loop':^30} | {'with env.step':^30}")
    ratios = {}
    for p in policies:
        (t50, t99), (e50, e99) = summary(p.tight), summary(p.env)
        ratios[p.name] = (ref_tight / t50, ref_env / e50)
        print(
            f"{p.name:<28} {p.weight_bytes / 1024:>10.1f} | {t50:>8.1f} {t99:>8.1f} {ratios[p.name][0]:>10.2f}x"
            f" | {e50:>8.1f} {e99:>8.1f} {ratios[p.name][1]:>10.2f}x"
        )
    return ratios


def print_batches(title: str, policies: list[Policy], batches: list[int]) -> dict[str, dict[int, float]]:
    """Print one group's batch table; return each policy's p50 ratio to the reference at each batch."""
    ref = next(p for p in policies if p.name == REFERENCE)

    def p50(p: Policy, b: int) -> float:
        return summary(p.tight if b == 1 else p.batched[b])[0]

    print(f"\n{title}, by batch (tight loop, one call per batch)")
    header = " | ".join(f"{f'batch {b}: p50 us, us/row, row gain, vs ORT int8':^46}" for b in batches)
    print(f"{'policy':<28} | {header}")
    ratios: dict[str, dict[int, float]] = {}
    for p in policies:
        cells, ratios[p.name] = [], {}
        for b in batches:
            ratios[p.name][b] = p50(ref, b) / p50(p, b)
            per_row = p50(p, b) / b
            cells.append(
                f"{p50(p, b):>10.1f} {per_row:>9.1f} {p50(p, 1) / per_row:>9.2f}x {ratios[p.name][b]:>10.2f}x  "
            )
        print(f"{p.name:<28} | " + " | ".join(cells))
    return ratios


TARGETS = [  # (group, policy, least ratio to ORT int8 dense, stretch)
    ("17-2048-2048-2048-6", "rlq circulant B=16 int8", 3.0, 5.0),
    ("17-2048-2048-2048-6", "rlq circulant B=8 int8", 2.0, None),
    ("17-2048-2048-2048-6", "rlq 90% 16x4-sparse int8", 2.0, None),
    ("TD3 actor 17-400-300-6", "rlq dense int8", 1.0, None),
    ("TD3 actor 17-400-300-6", "rlq circulant B=4 int8", 1.0, None),
    ("TD3 actor 17-400-300-6", "rlq 90% 16x4-sparse int8", 2.0, None),
]
TD3_SPARSE = "rlq 90% 16x4-sparse int8"
TD3_OVER_DENSE = 1.5
"""The block-pruned TD3 actor's target against rlq's own dense int8 kernel: the speed must come from the blocks."""


def print_targets(ratios: dict[str, dict[str, tuple[float, float]]]) -> None:
    print("\ntargets (p50 ratio to ORT int8 dense, tight loop / with env.step):")
    for group, name, least, stretch in TARGETS:
        if name not in ratios.get(group, {}):
            continue
        tight, env = ratios[group][name]
        verdict = "met" if min(tight, env) >= least else "missed"
        extra = f", stretch {stretch}x {'met' if min(tight, env) >= stretch else 'missed'}" if stretch else ""
        print(f"  {group} {name}: {tight:.2f}x / {env:.2f}x, target >= {least}x {verdict}{extra}")
    td3 = ratios.get("TD3 actor 17-400-300-6", {})
    if TD3_SPARSE in td3 and "rlq dense int8" in td3:
        over = [sparse / dense for sparse, dense in zip(td3[TD3_SPARSE], td3["rlq dense int8"], strict=True)]
        verdict = "met" if min(over) >= TD3_OVER_DENSE else "missed"
        print(
            f"  TD3 actor {TD3_SPARSE} over rlq dense int8: {over[0]:.2f}x / {over[1]:.2f}x, "
            f"target >= {TD3_OVER_DENSE}x {verdict}"
        )


BATCH_TARGETS = [  # (group, policy, batch, least ratio to ORT int8 dense at the same batch)
    ("17-2048-2048-2048-6", "rlq circulant B=16 int8", 8, 3.0),
    ("17-2048-2048-2048-6", "rlq circulant B=16 int8", 64, 3.0),
]


def print_batch_targets(ratios: dict[str, dict[str, dict[int, float]]]) -> None:
    print("\nbatch targets (p50 ratio to ORT int8 dense at the same batch, tight loop):")
    for group, name, batch, least in BATCH_TARGETS:
        ratio = ratios.get(group, {}).get(name, {}).get(batch)
        if ratio is not None:
            print(
                f"  {group} {name} batch {batch}: {ratio:.2f}x, target >= {least}x {'met' if ratio >= least else 'missed'}"
            )


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--blocks", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.9, 0.95])
    parser.add_argument("--rounds", type=int, default=5, help="rounds; medians are over them")
    parser.add_argument("--budget", type=float, default=0.25, help="seconds of calls per policy and round")
    parser.add_argument(
        "--batches", type=int, nargs="+", default=[1], help="batch sizes to time back to back (1 always)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 256 and 2048 wide, B=16, batches 1 and 8, 2 rounds"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.widths, args.blocks, args.sparsities, args.rounds, args.budget = (
            [256, 2048],
            [16],
            [0.9],
            2,
            0.02,
        )
        args.batches = [1, 8]
    args.batches = sorted({1, *args.batches})
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    print(f"rlq.deploy latency, one thread; {os.cpu_count()} cpus; kernels built: {kernels_available()}")
    print(f"CPU: {cpu_model()}")
    print(f"uptime before: {uptime()}")
    print(
        f"tight: back-to-back calls; with env.step: one {ENV_ID} env.step between calls (policy timed alone)"
    )
    with tempfile.TemporaryDirectory(prefix="rlq-bench-deploy-") as tmp:
        folder = Path(tmp)
        groups = {
            f"17-{w}-{w}-{w}-6": width_policies(w, args.blocks, args.sparsities, folder) for w in args.widths
        }
        groups["TD3 actor 17-400-300-6"] = td3_policies(folder)
        lo, hi = (20, 200) if args.quick else (50, 2000)
        measure(groups, args.rounds, args.budget, lo, hi, args.batches)
    ratios = {title: print_group(title, policies) for title, policies in groups.items()}
    print_targets(ratios)
    if len(args.batches) > 1:
        batch_ratios = {title: print_batches(title, ps, args.batches) for title, ps in groups.items()}
        print_batch_targets(batch_ratios)
    print(f"\nuptime after: {uptime()}")


if __name__ == "__main__":
    main()
