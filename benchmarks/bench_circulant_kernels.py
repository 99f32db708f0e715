"""Time the compiled block-circulant kernels against rlq's PyTorch path, side by side, and check they agree.

Run: ``.venv/bin/python benchmarks/bench_circulant_kernels.py [--repeats 7] [--calls 500]`` on a quiet
machine (the header prints the load). For each Linear shape and B with a compiled kernel
(:data:`rlq.compress.circulant.KERNEL_BLOCK_SIZES`), times the expansion of the B-vectors to the dense
weight and the cyclic-diagonal sums of a dense gradient (the expansion's backward), once through the C
kernels of ``rlq/compress/_circulant_kernels.c`` and once through the PyTorch ops rlq uses without them
(``USE_KERNELS = False``), alternating the two ``--repeats`` times; prints the median microseconds per call
of each and torch/kernel (above 1: the kernel is faster). Every kernel result is first checked bit for
bit against the definition (a gather through the index map; an ``index_add_`` into zeros).
One torch thread, as the GST training benchmark.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from rlq.compress import circulant
from rlq.core.cpu import cpu_model

SHAPES = ((400, 300), (256, 256), (64, 64), (1024, 1024))  # (out, in): SB3's TD3 hidden layer first


def _time(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def measure(out: int, inp: int, block_size: int, repeats: int, calls: int) -> dict[str, tuple[float, float]]:
    """Return ``{op: (torch seconds, kernel seconds)}`` per call, medians over alternating repeats."""
    generator = torch.Generator().manual_seed(0)
    vectors = torch.randn(out // block_size, inp // block_size, block_size, generator=generator)
    grad = torch.randn(out, inp, generator=generator)
    ops = {
        "expand": lambda: circulant._expand(vectors),
        "grad sums": lambda: circulant._cyclic_diagonal_sums(grad, block_size),
    }
    # the definitions, bit for bit: a gather through the index map, and an index_add_ into zeros (the order
    # the kernel adds in; PyTorch's slice path for large layers adds the same numbers in another order)
    index = circulant._expansion_index(tuple(vectors.shape), vectors.device)
    references = {
        "expand": vectors.reshape(-1)[index].view(out, inp),
        "grad sums": grad.new_zeros(vectors.numel())
        .index_add_(0, index, grad.reshape(-1))
        .view(vectors.shape),
    }
    results = {}
    for name, fn in ops.items():
        circulant.USE_KERNELS = True
        if not torch.equal(fn().view(torch.int32), references[name].view(torch.int32)):
            raise AssertionError(
                f"{name} at {out}x{inp}, B={block_size}: the kernel differs from the definition"
            )
        times = {False: [], True: []}
        for _ in range(repeats):
            for use in (False, True):
                circulant.USE_KERNELS = use
                fn()  # warm
                times[use].append(_time(fn, calls))
        results[name] = (statistics.median(times[False]), statistics.median(times[True]))
    circulant.USE_KERNELS = True
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="alternating timed repeats (median taken)")
    parser.add_argument("--calls", type=int, default=500, help="calls per timed repeat")
    args = parser.parse_args()
    if not circulant.kernels_available():
        raise SystemExit(
            "rlq was installed without its compiled kernels (no C compiler?): nothing to compare"
        )
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, 1 thread, {cpu_model()}, load {load:.2f}")
    header = f"{'shape':>10} {'B':>2} | {'op':>9} | {'torch us':>9} {'kernel us':>9} | torch/kernel"
    print(header)
    print("-" * len(header))
    for out, inp in SHAPES:
        for block_size in circulant.KERNEL_BLOCK_SIZES:
            if out % block_size or inp % block_size:
                continue
            calls = max(5, args.calls * 120_000 // (out * inp))
            for name, (slow, fast) in measure(out, inp, block_size, args.repeats, calls).items():
                print(
                    f"{out:>4}x{inp:<5} {block_size:>2} | {name:>9} | {slow * 1e6:>9.1f} {fast * 1e6:>9.1f} | "
                    f"{slow / fast:.2f}"
                )


if __name__ == "__main__":
    main()
