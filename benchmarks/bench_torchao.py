"""torchao's CPU int8 against the ``torch.ao`` path rlq's PTQ uses, side by side: does torchao pay to move to?

Issue 16 asks whether torchao (0.18), which ``torch.ao.quantization``'s deprecation warning points to, gives
working and faster CPU int8 kernels here. torchao is not an rlq dependency; install it to run this:

    .venv/bin/pip install torchao==0.18.0 --no-deps          # or --target DIR and PYTHONPATH=DIR
    .venv/bin/python benchmarks/bench_torchao.py [--repeats 200] [--rounds 5] [--threads 1]

Models (random weights; latency does not depend on the values): ``td3`` 17-256-256-6 (a HalfCheetah TD3
actor) and ``mlp2048`` 24-2048-2048-2048-6 (ActorQ's paper-size policy), at batch 1 (an actor acting) and
batch 256 (a learner's minibatch). Backends, each one thread, timed in interleaved rounds in one process:

- ``torch fp32``: the float model, eager.
- ``torch.ao int8``: ``rlq.quant.ptq(model, "int8")``, dynamic quantization (int8 weights, activations per
  batch), what rlq ships.
- ``torchao w8a8``: ``quantize_(model, Int8DynamicActivationInt8WeightConfig())``, the same scheme in torchao.
- ``torchao w8``: ``quantize_(model, Int8WeightOnlyConfig())``, int8 weights, float activations.

Prints the median latency per backend, each backend's ratio to torch fp32 and to ``torch.ao int8`` (median
over rounds of the paired ratio), and each int8 backend's largest output error against fp32 (it works when
the error is of the int8 grid's size). Measure on a quiet machine and write ``uptime`` beside the figures.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess

import torch
import torch.nn as nn

from rlq.core.cpu import cpu_model
from rlq.quant import ptq
from rlq.quant.latency import measure_latency


def mlp(sizes: list[int]) -> nn.Module:
    """Return a ReLU MLP with the given layer sizes, in eval mode (seeded)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).eval()


MODELS = {"td3": [17, 256, 256, 6], "mlp2048": [24, 2048, 2048, 2048, 6]}


def backends(model: nn.Module) -> dict[str, nn.Module]:
    """Return the four backends of ``model`` (the torchao ones only if torchao imports)."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

    built = {"torch fp32": model, "torch.ao int8": ptq(model, "int8")}
    for name, config in (("torchao w8a8", Int8DynamicActivationInt8WeightConfig()),
                         ("torchao w8", Int8WeightOnlyConfig())):  # fmt: skip
        copied = copy.deepcopy(model)
        quantize_(copied, config)
        built[name] = copied.eval()
    return built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="timed calls per backend and round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--batches", default="1,256", help="comma-separated batch sizes")
    args = parser.parse_args()
    try:
        import torchao
    except ImportError:
        raise SystemExit(
            "torchao is not installed: .venv/bin/pip install torchao==0.18.0 --no-deps"
        ) from None
    torch.set_num_threads(args.threads)
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"torch {torch.__version__}, torchao {torchao.__version__}, {torch.get_num_threads()} thread(s), "
          f"{cpu_model()}, {os.cpu_count()} cpus; uptime: {uptime}")  # fmt: skip
    for model_name, sizes in MODELS.items():
        built = backends(mlp(sizes))
        for batch in (int(b) for b in args.batches.split(",")):
            x = torch.randn(batch, sizes[0])
            with torch.inference_mode():
                reference = built["torch fp32"](x)
                errors = {name: float((m(x) - reference).abs().max()) for name, m in built.items()}
                per_round: dict[str, list[float]] = {name: [] for name in built}
                for _ in range(args.rounds):
                    for name, m in built.items():
                        per_round[name].append(
                            measure_latency(m, x, repeats=args.repeats, warmup=10)["median_us"]
                        )
            print(f"\n{model_name} {'-'.join(map(str, sizes))}, batch {batch}")
            print(
                f"{'backend':>14} | {'median us':>10} | {'vs torch fp32':>13} | {'vs torch.ao int8':>16} | max |error|"
            )
            for name, times in per_round.items():
                fp32 = statistics.median(t / f for t, f in zip(times, per_round["torch fp32"], strict=True))
                ao = statistics.median(t / f for t, f in zip(times, per_round["torch.ao int8"], strict=True))
                print(f"{name:>14} | {statistics.median(times):>10.1f} | {fp32:>12.2f}x | {ao:>15.2f}x | "
                      f"{errors[name]:.2e}")  # fmt: skip
    print("\nuptime after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
