"""Time a block-circulant Linear layer's two forward paths, FFT versus dense expansion, side by side.

Run: ``.venv/bin/python benchmarks/bench_block_circulant.py [--repeats 20] [--threads 2]``. Prints, for
256 and 1024 wide layers, B in {2, 4, 8, 16} and batch 1 and 256, the median time of the dense expansion path
(rlq's default: expand the B-vectors, one matmul), of the FFT path, and their ratio fft/dense (below 1:
FFT faster), for inference and for a training step (forward + backward); the time of a plain dense
nn.Linear of the same size, and the faster block-circulant path's time over it (best/plain: above 1, the
block-circulant layer is slower than nn.Linear). Also prints what ``choose_forward_path`` would pick.
"""

from __future__ import annotations

import argparse

import torch

from rlq.compress import CirculantCall, measure_forward_paths
from rlq.core.cpu import cpu_model

WIDTHS = (256, 1024)  # square layers, in = out
BLOCK_SIZES = (2, 4, 8, 16)
BATCHES = (1, 256)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per measurement (median taken)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu_model()}")
    header = (
        f"{'width':>5} {'B':>3} {'batch':>5} | {'mode':>5} | {'plain us':>9} {'dense us':>9} {'fft us':>9} "
        f"| {'fft/dense':>9} | {'best/plain':>10} | choice"
    )
    print(header)
    print("-" * len(header))
    for width in WIDTHS:
        for block_size in BLOCK_SIZES:
            for batch in BATCHES:
                for training in (False, True):
                    call = CirculantCall(width, width, block_size, batch, training=training)
                    t = measure_forward_paths(call, repeats=args.repeats, warmup=3)
                    ratio = t["fft"] / t["dense"]
                    versus_plain = min(t["fft"], t["dense"]) / t["plain"]
                    choice = "fft" if t["fft"] < t["dense"] else "dense"
                    mode = "train" if training else "infer"
                    print(
                        f"{width:>5} {block_size:>3} {batch:>5} | {mode:>5} | {t['plain'] * 1e6:>9.1f} "
                        f"{t['dense'] * 1e6:>9.1f} {t['fft'] * 1e6:>9.1f} | {ratio:>9.2f} | {versus_plain:>10.2f} | {choice}"
                    )


if __name__ == "__main__":
    main()
