"""``rlq export``: a trained policy written as a C file pair or an ONNX model, checked on observations if asked."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _npy_file(path: Path | None, flag: str) -> Any:
    """Return the array saved at ``path`` (a NumPy ``.npy`` file), or None without a path."""
    if path is None:
        return None
    import numpy as np

    if not path.is_file():
        raise FileNotFoundError(f"no {flag.lstrip('-')} file at {path}")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise ValueError(f"{flag} {path}: not a NumPy .npy array ({e})") from e


def _checkable(args: argparse.Namespace, policy: Any) -> Any:
    """Return the ``--check`` observations, refused before anything is written if they cannot be run."""
    observations = _npy_file(args.check, "--check")
    if observations is None:
        return None
    from rlq.deploy.c_build import c_compiler
    from rlq.deploy.check import check_observations
    from rlq.deploy.reader import read_policy

    if args.format == "c" and c_compiler() is None:
        raise ValueError(
            "--check builds the C file for this machine: no C compiler found (set CC, or install gcc)"
        )
    return check_observations(observations, read_policy(policy)[0][0].n_in)


def _cmd_export(args: argparse.Namespace) -> int:
    from rlq.deploy.export import export_policy, load_policy_source

    calibration = _npy_file(args.calibration, "--calibration")
    try:
        policy = load_policy_source(args.source)
        observations = _checkable(args, policy)
        result = export_policy(
            policy, args.out, args.format, precision=args.precision, name=args.name, calibration=calibration
        )
    except TypeError as e:  # an unsupported layer or space
        raise ValueError(str(e)) from e
    except (FileExistsError, FileNotFoundError):
        raise
    except OSError as e:  # a full disk, an over-long or unwritable path: the export left nothing behind
        where = f" ({e.filename})" if e.filename and str(e.filename) != str(args.out) else ""
        raise ValueError(f"export to {args.out} failed: {e.strerror or e}{where}; nothing was written") from e
    if args.format == "c":
        print(
            f"{result.source} and {result.header.name}: {result.obs_dim} -> {result.action_dim}, "
            f"{result.weight_bytes} bytes of weights, {result.stack_bytes} bytes of stack"
        )
    else:
        print(f"{result}: {result.stat().st_size} bytes")
    if observations is None:
        return 0
    from rlq.deploy.check import check_export

    check = check_export(result, policy, observations, args.precision, calibration=calibration)
    print(f"checked on {check.observations:,} observations:")
    for comparison in check.comparisons:
        print(f"  {comparison.line()}")
    if not check.ok:
        print(
            f"rlq: the export in {args.out} does not compute what its policy does (see above); "
            "its files are kept for inspection",
            file=sys.stderr,
        )
        return 1
    return 0


def add_export_parser(sub: Any) -> None:
    """Add ``rlq export`` to the ``rlq`` command's subparsers ``sub``."""
    p = sub.add_parser(
        "export", help="write a trained policy as a dependency-free C file pair or an ONNX model"
    )
    p.add_argument("source", type=Path, help="an SB3 model .zip, or a run folder with a trained agent")
    p.add_argument("--format", choices=("c", "onnx"), default="c")
    p.add_argument("--out", type=Path, required=True, help="a new folder for the files")
    p.add_argument(
        "--precision",
        choices=("fp32", "int8", "int4", "int2"),
        default="fp32",
        help="how dense layers are stored (int4, int2: codes packed into bit streams; C only)",
    )
    p.add_argument("--name", default="policy", help="the files' and C function's prefix (a C identifier)")
    p.add_argument(
        "--calibration",
        type=Path,
        help="typical observations, a .npy array (n, obs_dim): at int8 and below the C function scales each "
        "input feature by them; ONNX int8 takes its static ranges from them",
    )
    p.add_argument(
        "--check",
        type=Path,
        help="observations, a .npy array (n, obs_dim), to run the written files on (the C file built with this "
        "machine's C compiler) and compare with the PyTorch policy; exit status 1 if a tolerance is not met",
    )
    p.set_defaults(func=_cmd_export)
