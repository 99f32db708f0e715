"""Flash, stack and instructions per action of exported TD3 actors on a Cortex-M4 (QEMU's ``mps2-an386``).

Actors (random weights; sizes and counts do not depend on their values beyond ``tanhf``'s paths): TD3's
action path for Pendulum-v1 (3 observations, 1 action) and Hopper-v5 (11, 3), at rl-zoo3's 400x300 and at
256x256, dense or with the hidden layer block-circulant (B = 16, as GST trains it), exported at fp32, int8
and int4 (:func:`rlq.deploy.write_c`; int4: the dense layers' codes packed two per byte, the block-circulant
layer's DFTs int8). ``flash``: the policy's own object (code and ``const`` weights, compiled
with :data:`rlq.deploy.cortex_m.CFLAGS`), without the harness and libm; ``stack``: the scratch arrays
``policy_act`` keeps on its stack; ``instructions``: executed per call (median over 4 observations), counted
exactly by :func:`rlq.deploy.cortex_m.run_qemu` (instructions, not cycles). Needs ``make export-tools``.
Run:

    .venv/bin/python benchmarks/bench_cortex_m.py            # about a minute
    .venv/bin/python benchmarks/bench_cortex_m.py --quick    # the 16 KB candidate alone
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from rlq.compress import block_circulant_
from rlq.deploy import cortex_m, write_c
from rlq.rl.agents import make_model
from rlq.sb3.action_path import action_network

FLASH_TARGET = 16 * 1024
ACTORS = [
    ("Pendulum-v1", [256, 256], 16),
    ("Hopper-v5", [256, 256], 16),
    ("Pendulum-v1", [256, 256], None),
    ("Pendulum-v1", [400, 300], None),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if not cortex_m.tools_available():
        raise SystemExit(f"the Cortex-M tools are absent: {cortex_m.INSTALL_COMMAND}")
    torch.set_num_threads(1)
    print(
        f"{'actor':<40} {'precision':<9} {'flash B':>8} {'<= 16 KB':>8} {'stack B':>7} {'instructions':>12}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for env_id, arch, block in ACTORS[:1] if args.quick else ACTORS:
            model = make_model("TD3", env_id, seed=4, hyperparams=dict(policy_kwargs=dict(net_arch=arch)))
            if block:
                block_circulant_(action_network(model)[0], block)
            obs = (
                np.random.default_rng(5).normal(size=(4, model.observation_space.shape[0])).astype(np.float32)
            )
            label = f"TD3 {env_id} {arch[0]}x{arch[1]}" + (f" circulant B={block}" if block else " dense")
            for precision in ("fp32", "int8", "int4"):
                tag = f"{len(list(work.iterdir()))}"
                export = write_c(model, work / tag, precision=precision)
                flash = cortex_m.policy_object_sizes(export.folder, work / f"{tag}o")["flash"]
                elf = cortex_m.build_cortex_m(export.folder, export.name, obs, work / f"{tag}b")
                _, counts = cortex_m.run_qemu(elf, timeout=600)
                fits = "yes" if flash <= FLASH_TARGET else "no"
                print(
                    f"{label:<40} {precision:<9} {flash:8d} {fits:>8} {export.stack_bytes:7d} "
                    f"{int(np.median(counts)):12d}"
                )


if __name__ == "__main__":
    main()
