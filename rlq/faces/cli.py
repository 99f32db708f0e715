"""The ``rlq`` command: list experiments, show their parameters, run them (or sweeps of them) into run folders."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from rlq.experiments.paths import default_runs_dir
from rlq.experiments.registry import Experiment, ExperimentError, get_experiment, list_experiments
from rlq.faces.cli_campaign import add_campaign_parser
from rlq.faces.cli_export import add_export_parser
from rlq.faces.cli_sweep import add_sweep_parser

EXIT_BAD_INPUT = 2


def _fmt_presets(exp: Experiment) -> str:
    return ", ".join(f"{p} ({exp.wall_times[p]})" if p in exp.wall_times else p for p in exp.presets)


def _cmd_list(args: argparse.Namespace) -> int:
    experiments = list_experiments()
    width = max((len(e.name) for e in experiments), default=10)
    for exp in experiments:
        print(f"{exp.name:<{width}}  {exp.description}")
        print(f"{'':<{width}}  presets: {_fmt_presets(exp)}")
    return 0


def _cmd_params(args: argparse.Namespace) -> int:
    exp = get_experiment(args.name)
    print(f"{exp.name}: {exp.description}")
    rows = [(p.name, p.type_name, repr(p.default), p.comment) for p in exp.parameters.values()]
    widths = [max(len(r[i]) for r in rows + [("name", "type", "default", "")]) for i in range(3)]
    print(f"{'name':<{widths[0]}}  {'type':<{widths[1]}}  {'default':<{widths[2]}}  comment")
    for name, kind, default, comment in rows:
        print(f"{name:<{widths[0]}}  {kind:<{widths[1]}}  {default:<{widths[2]}}  {comment}")
    for preset, values in exp.presets.items():
        wall = f" [{exp.wall_times[preset]}]" if preset in exp.wall_times else ""
        print(f"preset {preset}{wall}: " + ", ".join(f"{k}={v!r}" for k, v in values.items()))
    return 0


def _summary_line(name: str, outcome) -> str:
    numbers = {
        k: v for k, v in outcome.results.items() if k not in ("experiment", "preset", "started", "finished")
    }
    shown = ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in numbers.items()
        if isinstance(v, (int, float, str)) and k not in ("status", "run_seconds", "error")
    )
    text = f"{name}: {outcome.status} in {outcome.results.get('run_seconds', 0):.1f} s"
    if outcome.status != "ok":
        text += f" ({outcome.results.get('error', '')})"
    return f"{text}; {shown} -> {outcome.path}"


def _cmd_run(args: argparse.Namespace) -> int:
    from rlq.experiments.runner import check_out_dir, resume_run, run_experiment

    if args.rerun and not args.resume:
        raise ExperimentError("--rerun goes with --resume RUN_DIR")
    if args.resume:
        if args.name or args.preset or args.param or args.reuse or args.retrain:
            raise ExperimentError(
                "--resume takes the run folder's own parameters and runs: give no NAME, --preset, -p, --reuse "
                "or --retrain"
            )
        outcome = resume_run(
            args.resume, rerun=args.rerun, progress=not args.quiet, log_output=args.log_output
        )
    else:
        if not args.name:
            raise ExperimentError("rlq run needs an experiment NAME (see `rlq list`) or --resume RUN_DIR")
        experiment = get_experiment(args.name)  # every input is checked before anything is announced
        params = experiment.resolve(args.preset, [tuple(p) for p in args.param])
        experiment.check_requirements()
        if args.reuse or args.retrain:  # checked before anything is announced
            from rlq.experiments.reuse import plan_reuse

            plan_reuse(args.reuse, experiment.name, params, args.retrain)
        check_out_dir(args.out)
        wall = _wall_time(experiment, params.get("preset", args.preset), params, args.yes)
        print(f"rlq: running {args.name} (preset {args.preset or 'defaults'})", file=sys.stderr)
        if wall:
            print(f"rlq: {wall}", file=sys.stderr)
        outcome = run_experiment(
            args.name,
            args.preset,
            [tuple(p) for p in args.param],
            args.out,
            reuse=args.reuse,
            retrain=args.retrain,
            progress=not args.quiet,
            log_output=args.log_output,
        )
    if not outcome.ok:
        print(f"rlq: run {outcome.status}: {outcome.results.get('error', '')}", file=sys.stderr)
    print(outcome.path)
    return 0 if outcome.ok else 1


def _wall_time(experiment: Experiment, preset: str | None, params: dict[str, Any], yes: bool) -> str:
    """Return the run's expected wall time as text, or raise ExperimentError when it is absurd and not ``yes``."""
    from rlq.experiments.wall_time import MAX_SECONDS, estimate_wall_time

    wall = estimate_wall_time(experiment, preset, params)
    if wall.absurd and not yes:
        raise ExperimentError(
            f"{wall.text}; that is over {MAX_SECONDS / 86400:.0f} days: pass --yes to run it anyway"
        )
    return wall.text


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from rlq.experiments.runner import run_experiment

    experiments = list_experiments()
    known = sorted({preset for exp in experiments for preset in exp.presets})
    if args.preset not in known:
        raise ExperimentError(f"no experiment has a preset {args.preset!r}; the presets are {known}")
    lines, failed = [], 0
    for exp in experiments:
        if args.preset not in exp.presets:
            lines.append(f"{exp.name}: skipped (no preset {args.preset!r})")
            continue
        missing = exp.missing()
        if missing:
            needs = "; ".join(f"{m}: {how}" for m, how in missing.items())
            lines.append(f"{exp.name}: skipped (needs {needs})")
            continue
        print(f"rlq: running {exp.name} at preset {args.preset}", file=sys.stderr)
        outcome = run_experiment(exp.name, args.preset, [], args.out, progress=not args.quiet)
        failed += not outcome.ok
        lines.append(_summary_line(exp.name, outcome))
    print(f"\nrlq reproduce ({args.preset}): {len(lines) - failed} of {len(lines)} experiments ok")
    for line in lines:
        print("  " + line)
    return 1 if failed else 0


def _cmd_publish(args: argparse.Namespace) -> int:
    from rlq.experiments.results import publish

    print(publish(args.run_dir, overwrite=args.overwrite, name=args.name))
    return 0


def _add_publish(sub: Any) -> None:
    p = sub.add_parser("publish", help="copy a finished run's CSVs into data/results/<experiment>/<preset>/")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--overwrite", action="store_true", help="replace results already published there")
    p.add_argument(
        "--as", dest="name", default=None,
        help="publish under data/results/<experiment>/NAME/ (a variant of its preset, such as an ablation, must)",
    )  # fmt: skip
    p.set_defaults(func=_cmd_publish)


def _cmd_migrate_jobs(args: argparse.Namespace) -> int:
    from rlq.experiments.run_folders import PARAMS_FILE
    from rlq.experiments.run_lock import run_folder_lock
    from rlq.rl.parallel import JOBS_FOLDER, PICKLED_FOLDER, ResultStore

    run = args.run_dir
    if not (run / PARAMS_FILE).is_file():
        raise FileNotFoundError(f"{run} is not a run folder (no {PARAMS_FILE})")
    store = ResultStore(run / JOBS_FOLDER)
    if not store.pickled():
        print(f"{store.folder} holds no pickled job results; nothing to convert")
        return 0
    with run_folder_lock(run):
        written = store.migrate_pickles()
    print(
        f"converted {len(written)} job results in {store.folder} to JSON; the pickles are kept in "
        f"{store.folder / PICKLED_FOLDER} (delete them once the run resumes)"
    )
    return 0


def _add_migrate_jobs(sub: Any) -> None:
    p = sub.add_parser(
        "migrate-jobs",
        help="convert a trusted run folder's job results saved as pickles to JSON "
        "(reading a pickle runs the code it holds: only for a folder you made or trust)",
    )
    p.add_argument("run_dir", type=Path)
    p.set_defaults(func=_cmd_migrate_jobs)


def _cmd_runs(args: argparse.Namespace) -> int:
    from rlq.core.jsonio import read_json
    from rlq.experiments.run_folders import RESULTS_FILE, list_runs, run_state

    if args.name is not None:
        if "/" in args.name or Path(args.name).is_dir():
            raise ExperimentError(
                f"{args.name!r} is a folder; list the runs under it with --runs {args.name}"
            )
        get_experiment(args.name)  # an unknown name is named, with the known ones
    paths = list_runs(args.runs, args.name)
    if not paths:
        print(f"no {args.name + ' ' if args.name else ''}runs under {args.runs}")
    for path in paths:
        try:
            results = read_json(path / RESULTS_FILE)
        except ValueError as e:
            print(f"{path}  unreadable ({e})")
            continue
        state = run_state(path, results)
        print(f"{path}  {state}  preset={results.get('preset')}  started={results.get('started')}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from rlq.faces.report import build_report

    if args.figures:
        from rlq.experiments.paths import repo_root
        from rlq.faces.static_figures import (
            render_claims_figures,
            render_committed_figures,
            render_confirmatory_figure,
        )

        written = render_committed_figures()
        written += render_claims_figures(repo_root() / "docs" / "figures")
        written += render_confirmatory_figure(repo_root() / "docs" / "figures")
        for png in written:
            print(png)
    formats = ("html", "md") if args.format == "md" else ("html",)
    path, text = build_report(args.runs, args.out, formats=formats)
    print(text)
    print(path)
    if "md" in formats:
        print(path.with_suffix(".md"))
    return 0


def _add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="run an experiment notebook into a new run folder")
    p.add_argument("name", nargs="?", help="experiment name (see `rlq list`)")
    p.add_argument(
        "--preset", help="named parameter set declared in the notebook (quick, medium, paper, ...)"
    )
    p.add_argument(
        "-p",
        "--param",
        nargs=2,
        action="append",
        default=[],
        metavar=("KEY", "VALUE"),
        help="override one parameter; wins over the preset",
    )
    p.add_argument(
        "--out", type=Path, default=default_runs_dir(), help="parent of run folders (default: runs/)"
    )
    p.add_argument(
        "--resume", type=Path, metavar="RUN_DIR", help="continue an interrupted or failed run folder"
    )
    p.add_argument(
        "--rerun",
        action="store_true",
        help="with --resume: run a finished run's notebook again over its checkpoints (nothing retrains)",
    )
    p.add_argument(
        "--reuse",
        type=Path,
        action="append",
        default=[],
        metavar="FOLDER",
        help="load the finished runs of this run folder or published run instead of training them (e.g. to add "
        "seeds to a run); its settings must be this run's",
    )
    p.add_argument(
        "--retrain",
        action="append",
        default=[],
        metavar="RUN",
        help="with --reuse: train this run again instead of loading it, named by its fields, e.g. "
        "method=gst,seed=2 (may be given more than once)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--log-output", action="store_true", help="stream the notebook's cell output")
    p.add_argument("--yes", action="store_true", help="run even when the estimated wall time is over 30 days")
    p.set_defaults(func=_cmd_run)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``rlq`` command."""
    parser = argparse.ArgumentParser(prog="rlq", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list experiments, their descriptions and presets").set_defaults(
        func=_cmd_list
    )

    p = sub.add_parser("params", help="show an experiment's parameters, defaults, types and presets")
    p.add_argument("name")
    p.set_defaults(func=_cmd_params)

    _add_run(sub)

    add_sweep_parser(sub)

    add_campaign_parser(sub)

    p = sub.add_parser("runs", help="list run folders and their state (ok, failed, running, interrupted)")
    p.add_argument("name", nargs="?", help="only this experiment's runs")
    p.add_argument(
        "--runs", type=Path, default=default_runs_dir(), help="parent of run folders (default: runs/)"
    )
    p.set_defaults(func=_cmd_runs)

    p = sub.add_parser("reproduce", help="run every experiment at one preset and summarise")
    p.add_argument("--preset", default="quick")
    p.add_argument("--out", type=Path, default=default_runs_dir())
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_reproduce)

    _add_publish(sub)

    add_export_parser(sub)

    _add_migrate_jobs(sub)

    p = sub.add_parser("report", help="which paper claims hold: runs/report.html and the verdicts as text")
    p.add_argument(
        "--runs", type=Path, default=default_runs_dir(), help="parent of run folders (default: runs/)"
    )
    p.add_argument("--out", type=Path, help="HTML file, or a folder for report.html (default: <runs>/)")
    p.add_argument(
        "--format",
        choices=("html", "md"),
        default="html",
        help="md: also write the verdict table as Markdown beside the HTML (<runs>/report.md)",
    )
    p.add_argument(
        "--figures",
        action="store_true",
        help="first render each committed run's headline figures to data/results/<experiment>/<preset>/*.png "
        "and, to docs/figures/, each claim family's forest plot (committed results only) and the values behind "
        "each confirmatory verdict (needs kaleido and Chromium)",
    )
    p.set_defaults(func=_cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``rlq`` command line and return its exit code (2 for bad input)."""
    args = build_parser().parse_args(argv)
    previous = _stop_on_signals()
    try:
        return args.func(args)
    except (ExperimentError, FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"rlq: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("rlq: interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _stop_on_signals() -> Any:
    """Return the previous handlers after making SIGTERM and SIGHUP (a closed terminal) stop a run as Ctrl-C does.

    Main thread only (None elsewhere).
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    return {signum: signal.signal(signum, _raise_interrupt) for signum in (signal.SIGTERM, signal.SIGHUP)}


if __name__ == "__main__":
    sys.exit(main())
