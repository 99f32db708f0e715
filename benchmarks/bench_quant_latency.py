"""int8 vs fp32 policy latency on CPU, PyTorch and ONNX Runtime side by side, against the quantization targets.

Models (random weights: latency does not depend on their values):
- ``mlp2048``: 24-2048-2048-2048-6, ActorQ's paper-size D4PG policy. Target: the fastest int8 backend at
  least 10x faster than torch fp32.
- ``td3``: 17-256-256-6, a TD3 actor for HalfCheetah. Target: the fastest int8 backend no slower than the
  fastest fp32 backend.
- ``nature_cnn``: Mnih et al. 2015's CNN (convs 32/64/64, fc 512) on 4x84x84 Atari frames, 6 actions.
  Target: the fastest int8 backend at least 1.8x faster than torch fp32.

Each model runs on the four backends of ``rlq.quant.BACKENDS`` with one thread (an ActorQ actor's budget),
at each batch size, in one process; the table shows median latencies in microseconds. int8 backends of the
CNN are calibrated on random frames in [0, 1] (static quantization). Run:

    .venv/bin/python benchmarks/bench_quant_latency.py            # about 1-2 minutes on 2 cores
    .venv/bin/python benchmarks/bench_quant_latency.py --repeats 50 --batches 1
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from rlq.core.cpu import cpu_model
from rlq.quant import BACKENDS, compare_backends


def mlp(sizes: list[int]) -> nn.Sequential:
    """Return an MLP with ReLU between the layers of the given widths."""
    layers: list[nn.Module] = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(n_in, n_out), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def nature_cnn(n_actions: int = 6) -> nn.Sequential:
    """Return the DQN Nature CNN (Mnih et al. 2015) for 4x84x84 inputs."""
    return nn.Sequential(
        nn.Conv2d(4, 32, 8, stride=4),
        nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 512),
        nn.ReLU(),
        nn.Linear(512, n_actions),
    )


@dataclass
class Case:
    """A model to time, its input shape, and its target as a test on the measured latencies."""

    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    target: str
    met: Callable[[float, float, float], bool]
    """(torch fp32, best fp32, best int8) median latencies -> target met."""
    images: bool = False


CASES = [
    Case(
        "mlp2048",
        lambda: mlp([24, 2048, 2048, 2048, 6]),
        (24,),
        ">= 10x vs torch fp32",
        lambda t, f, i: t / i >= 10,
    ),
    Case("td3", lambda: mlp([17, 256, 256, 6]), (17,), "<= best fp32", lambda t, f, i: i <= f),
    Case("nature_cnn", nature_cnn, (4, 84, 84), ">= 1.8x vs torch fp32", lambda t, f, i: t / i >= 1.8, True),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32], help="batch sizes to time")
    parser.add_argument("--repeats", type=int, default=200, help="timed calls per backend (median taken)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed calls first")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of torch and ONNX Runtime")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import onnxruntime

    print(
        f"torch {torch.__version__} (quantized engine {torch.backends.quantized.engine}), onnxruntime "
        f"{onnxruntime.__version__}, {cpu_model()}, {os.cpu_count()} CPUs, "
        f"threads={args.threads}, repeats={args.repeats}; median latency in microseconds"
    )
    header = [
        "model",
        "batch",
        *BACKENDS,
        "best fp32",
        "best int8",
        "int8 vs torch fp32",
        "int8 vs best fp32",
    ]
    header += ["target", "met"]
    rows = []
    generator = torch.Generator().manual_seed(args.seed)
    for case in CASES:
        torch.manual_seed(args.seed)
        model = case.build().eval()
        for batch in args.batches:
            shape = (batch, *case.input_shape)
            example = (
                torch.rand(shape, generator=generator)
                if case.images
                else torch.randn(shape, generator=generator)
            )
            calibration = [torch.rand(shape, generator=generator) for _ in range(4)] if case.images else None
            timings = compare_backends(
                model,
                example,
                calibration=calibration,
                threads=args.threads,
                repeats=args.repeats,
                warmup=args.warmup,
            )
            median = {name: t["median_us"] for name, t in timings.items()}
            best_fp32 = min(("torch-fp32", "onnx-fp32"), key=median.get)
            best_int8 = min(("torch-int8", "onnx-int8"), key=median.get)
            torch_fp32, fp32, int8 = median["torch-fp32"], median[best_fp32], median[best_int8]
            rows.append(
                [
                    case.name,
                    str(batch),
                    *(f"{median[name]:.0f}" for name in BACKENDS),
                    best_fp32,
                    best_int8,
                    f"{torch_fp32 / int8:.2f}x",
                    f"{fp32 / int8:.2f}x",
                    case.target,
                    "yes" if case.met(torch_fp32, fp32, int8) else "NO",
                ]
            )
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    batch1 = [row for row in rows if row[1] == "1"]
    print(
        f"targets met at batch 1: {sum(row[-1] == 'yes' for row in batch1)}/{len(batch1)}; "
        f"at every batch size: {sum(row[-1] == 'yes' for row in rows)}/{len(rows)}"
    )


if __name__ == "__main__":
    main()
