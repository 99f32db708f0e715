"""Batch-1 latency of exported C policies (``rlq export --format c``) against ONNX Runtime, side by side.

Models (random weights): TD3's ``17-400-300-6`` actor (HalfCheetah's sizes) dense, and a ``17-256-256-6``
actor whose hidden layer is block-circulant (B = 8) or 90% pruned in 4x4 blocks. Each is exported at fp32
and int8 and built twice: ``-O2`` (portable, as a microcontroller build would be) and ``-O3 -march=native``.
The C column is timed inside a C loop (``clock_gettime`` around 2,000 calls on recorded observations, no
Python in between); ONNX Runtime's (the same weights dense, fp32, and int8 with dynamic quantization, one thread) from Python, one
call per observation, its call overhead included as a caller would pay it. Each figure is the
median of 5 rounds; ``vs ORT int8`` is ORT int8 dense's time over the row's (higher is faster). Run:

    .venv/bin/python benchmarks/bench_export.py            # about 15 s on 2 cores
    .venv/bin/python benchmarks/bench_export.py --quick    # a smoke run, seconds
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from rlq.compress import block_circulant_
from rlq.deploy.c_build import compile_c
from rlq.deploy.export import acting_module
from rlq.deploy.export_c import write_c
from rlq.quant import OnnxPolicy, export_onnx

OBS, ACT = 17, 6
HARNESS = r"""
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <time.h>
#include "policy.h"
#include "observations.h"

int main(void) {
    float action[POLICY_ACTION_DIM];
    struct timespec t0, t1;
    int r, i;
    for (r = 0; r < ROUNDS; r++) {
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (i = 0; i < CALLS; i++) policy_act(OBSERVATIONS + (i % COUNT) * POLICY_OBS_DIM, action);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("%.3f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / CALLS / 1e3);
    }
    return action[0] > 1e30f;
}
"""


def actor(hidden: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    sizes = [OBS, *hidden]
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(sizes[-1], ACT), nn.Tanh()).eval()


def models() -> dict[str, nn.Sequential]:
    torch.manual_seed(0)
    circulant = actor([256, 256])
    block_circulant_(circulant, 8)
    sparse = actor([256, 256])
    keep = torch.rand(64, 64) < 0.1
    with torch.no_grad():
        sparse[2].weight.mul_(keep.repeat_interleave(4, 0).repeat_interleave(4, 1))
    return {
        "TD3 400x300 dense": actor([400, 300]),
        "256x256 circulant B=8": circulant,
        "256x256 90% 4x4-sparse": sparse,
    }


def c_times(
    net: nn.Sequential, obs: np.ndarray, precision: str, flags: tuple[str, ...], work: Path, calls: int
) -> float:
    folder = work / f"{len(list(work.iterdir()))}"
    export = write_c(net, folder, precision=precision)
    values = ", ".join(f"{v:.9g}f" for v in obs.reshape(-1))
    (folder / "observations.h").write_text(
        f"#define COUNT {len(obs)}\n#define CALLS {calls}\n#define ROUNDS 5\n"
        f"static const float OBSERVATIONS[] = {{{values}}};\n"
    )
    (folder / "main.c").write_text(HARNESS)
    binary = folder / "bench"
    compile_c([folder / "main.c", export.source], binary, (f"-I{folder}", *flags))
    out = subprocess.run([str(binary)], capture_output=True, text=True).stdout.split()
    return statistics.median(float(v) for v in out)


def ort_times(net: nn.Sequential, obs: np.ndarray, precision: str, work: Path, calls: int) -> float:
    path = export_onnx(
        acting_module(net),
        work / f"{precision}-{len(list(work.iterdir()))}.onnx",
        torch.from_numpy(obs[:1]),
        precision,
    )
    policy = OnnxPolicy(path, threads=1)
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for i in range(calls):
            policy(obs[i % len(obs)][None])
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    calls = 100 if args.quick else 2000
    obs = np.random.default_rng(0).normal(size=(256, OBS)).astype(np.float32)
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"{'policy':<26} {'build':<22} {'us/call':>8} {'vs ORT int8':>11} {'weight KiB':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for label, net in models().items():
            reference = ort_times(
                actor([400, 300]) if "400" in label else actor([256, 256]), obs, "int8", work, calls
            )
            rows = [
                ("ORT int8 dense", "onnxruntime", reference, None),
                ("ORT fp32 dense", "onnxruntime", ort_times(net, obs, "fp32", work, calls), None),
            ]
            for precision in ("fp32", "int8"):
                for build, flags in (("C -O2", ()), ("C -O3 -march=native", ("-O3", "-march=native"))):
                    t = c_times(net, obs, precision, flags, work, calls)
                    nbytes = write_c(
                        net, work / f"size{len(list(work.iterdir()))}", precision=precision
                    ).weight_bytes
                    rows.append((f"C {precision}", build, t, nbytes))
            for name, build, t, nbytes in rows:
                kib = "" if nbytes is None else f"{nbytes / 1024:.1f}"
                print(
                    f"{label if name.startswith('ORT int8') else '':<26} {name + ', ' + build:<22} {t:8.2f} {reference / t:11.2f} {kib:>10}"
                )


if __name__ == "__main__":
    main()
