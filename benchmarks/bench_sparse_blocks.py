"""Batch-1 time of a published run's compiled actors with each block shape of their pruned layers, against dense.

For every final actor a published ``gst_block_deploy`` run saved, at int8 on rlq's compiled kernels, one
thread: the actor compiled dense (every layer ``dense_int8``), with its pruned layer stored in each shape of
``rlq.deploy.formats.SPARSE_BLOCKS`` (the other layers dense), and as ``compile_policy(model,
"int8")`` chooses by itself; all timed side by side (``measure_interleaved``) on one recorded observation.
Printed per actor: each one's median us per call and its ratio to dense (below 1: faster), the stored entries
of the pruned layer per shape, and the shapes ``choose_block`` picks with and without the kernels' vector
path. Pause other work first: these are timings.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch
from bench_input_scaling import RUN, agent

from rlq.core.cpu import cpu_model
from rlq.deploy import CompiledPolicy, compile_policy, kernels_available
from rlq.deploy.formats import SPARSE_BLOCKS, SparseI8, choose_block, kept_blocks
from rlq.deploy.reader import read_policy
from rlq.deploy.runtime import vector_blocks
from rlq.quant.latency import measure_interleaved
from rlq.sb3.quantized import collect_observations


def compiled_with(model, block: tuple[int, int] | None) -> CompiledPolicy:
    """Return ``model`` at int8 on the kernels, its most pruned layer in ``block``s (None: dense), the rest dense."""
    dense = compile_policy(model, "int8", max_sparse_density=0.0)
    specs, _ = read_policy(model)
    zeros = [float((s.weight == 0).mean()) if s.kind == "linear" else -1.0 for s in specs]
    ops = list(dense.ops)  # one op per layer, then the action scaling
    if block is not None:
        ops[int(np.argmax(zeros))] = SparseI8(specs[int(np.argmax(zeros))], block)
    return CompiledPolicy(ops, dense.output, dense.obs_dim, use_kernels=True)


def time_actor(model, obs: np.ndarray, repeats: int, rounds: int) -> tuple[dict, dict]:
    """Return each variant's median us per call and the stored entries of the pruned layer per shape."""
    variants = {"dense": compiled_with(model, None)}
    for block in SPARSE_BLOCKS:
        variants[f"{block[0]}x{block[1]}"] = compiled_with(model, block)
    variants["auto"] = compile_policy(model, "int8")
    nonzero = next(op for op in variants["16x4"].ops if isinstance(op, SparseI8)).codes != 0
    stored = {f"{b[0]}x{b[1]}": int(kept_blocks(nonzero, b).sum()) * b[0] * b[1] for b in SPARSE_BLOCKS}
    stored["nonzero"], stored["dense"] = int(nonzero.sum()), nonzero.size
    stored["auto"] = ", ".join(op.describe() for op in variants["auto"].ops if op.kernel != "affine")
    stored["loops pick"] = choose_block(nonzero)
    stored["vector pick"] = choose_block(nonzero, vector_blocks=True)
    timings = measure_interleaved({k: (v, obs) for k, v in variants.items()}, repeats=repeats, rounds=rounds)
    return {k: t["median_us"] for k, t in timings.items()}, stored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=RUN, help="a published gst_block_deploy run folder")
    parser.add_argument("--seeds", type=int, nargs="*", help="a subset of the run's seeds")
    parser.add_argument("--repeats", type=int, default=2000, help="timed calls per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    args = parser.parse_args()
    if not kernels_available():
        raise SystemExit("rlq.deploy's compiled kernels are not built: nothing to time")
    torch.set_num_threads(1)
    params = json.loads((args.run / "params.json").read_text())
    load = os.getloadavg()[0]
    print(
        f"{args.run.name} run of gst_block_deploy, {cpu_model()}, load {load:.2f}, one thread, batch 1; "
        f"vector path for 64-byte blocks: {vector_blocks(True)}"
    )
    for arm in params["arms"]:
        for seed in args.seeds or params["seeds"]:
            model = agent(args.run, params, arm, seed)
            obs = collect_observations(params["env_id"], 1, model=model, seed=seed + 1000).astype(np.float32)
            times, stored = time_actor(model, obs, args.repeats, args.rounds)
            print(
                f"{arm}__{seed}: auto = {stored['auto']}; choose_block: loops {stored['loops pick']}, "
                f"vector path {stored['vector pick']}; {stored['nonzero']} of {stored['dense']} codes nonzero"
            )
            for name, us in times.items():
                entries = f", {stored[name]} entries stored" if name in stored and name != "auto" else ""
                print(f"  {name:>6}: {us:6.2f} us, {us / times['dense']:.2f}x dense{entries}")
    print(
        f"median of {args.rounds} rounds x {args.repeats} calls each; load at the end {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
