"""``rlq sweep``: run an experiment once per point of a parameter grid (:mod:`rlq.experiments.sweeps`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rlq.experiments.paths import default_runs_dir
from rlq.experiments.registry import ExperimentError
from rlq.rl.parallel import EXECUTORS


def add_sweep_parser(sub: Any) -> None:
    """Add the ``sweep`` command to the ``rlq`` parser's subcommands ``sub``."""
    p = sub.add_parser(
        "sweep",
        help="run an experiment once per point of a parameter grid, into one sweep folder",
        description="Run NAME once per combination of the --grid values (each point an ordinary run folder) "
        "into <out>/sweeps/NAME/<UTC timestamp>-<id>/ with sweep.json and summary.csv.",
    )
    p.add_argument("name", nargs="?", help="experiment name (see `rlq list`)")
    p.add_argument("--preset", help="named parameter set every point starts from")
    p.add_argument(
        "-p", "--param", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
        help="a parameter every point shares; wins over the preset",
    )  # fmt: skip
    p.add_argument(
        "--grid", action="append", default=[], metavar="KEY=V1,V2,...",
        help="a parameter and its values (commas inside [...] stay in one value); repeat for a product",
    )  # fmt: skip
    p.add_argument("--executor", choices=EXECUTORS, default="processes", help="where points run")
    p.add_argument(
        "--ray-address", help="with --executor ray: the cluster to join (e.g. auto); else a local Ray"
    )
    p.add_argument(
        "--max-parallel", type=int, default=1, metavar="N", help="points running at once (default 1)"
    )
    p.add_argument("--out", type=Path, default=default_runs_dir(), help="parent of sweeps/ (default: runs/)")
    p.add_argument(
        "--resume",
        type=Path,
        metavar="SWEEP_DIR",
        help="run the missing, failed or interrupted points of a sweep",
    )
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run or resume a sweep; print its folder and return 0 when every point finished, else 1."""
    from rlq.experiments.sweeps import create_sweep, point_label, resume_sweep

    if args.max_parallel < 1:
        raise ExperimentError(f"--max-parallel must be at least 1, got {args.max_parallel}")
    if args.ray_address and args.executor != "ray":
        raise ExperimentError("--ray-address goes with --executor ray")
    if args.resume:
        if args.name or args.preset or args.param or args.grid:
            raise ExperimentError(
                "--resume takes the sweep's own grid and parameters: give no NAME, --preset, -p or --grid"
            )
        path = args.resume
        if not (path / "sweep.json").is_file():
            raise FileNotFoundError(f"{path} is not a sweep folder (no sweep.json)")
    else:
        if not args.name:
            raise ExperimentError("rlq sweep needs an experiment NAME (see `rlq list`) or --resume SWEEP_DIR")
        path = create_sweep(args.name, args.grid, args.preset, [tuple(p) for p in args.param], args.out)
        print(f"rlq: sweep of {args.name} in {path}", file=sys.stderr)

    def ended(point: dict[str, Any]) -> None:
        print(f"rlq: point {point['index']} ({point_label(point)}): {point['status']}", file=sys.stderr)

    try:
        sweep = resume_sweep(
            path,
            executor=args.executor,
            ray_address=args.ray_address,
            max_parallel=args.max_parallel,
            on_point=ended,
        )
    except RuntimeError as exc:  # e.g. Ray did not start: the sweep folder stays, resumable
        print(f"rlq: sweep stopped: {exc}; resume with `rlq sweep --resume {path}`", file=sys.stderr)
        print(path)
        return 1
    statuses = [p["status"] for p in sweep["points"]]
    ok = statuses.count("ok")
    print(f"rlq: sweep {ok} of {len(statuses)} points ok", file=sys.stderr)
    print(path)
    return 0 if ok == len(statuses) else 1
