"""``fedflex sweep`` and ``fedflex compare`` on the command line (:mod:`fedflex.study`).

fedflex sweep SCENARIO.yaml [dotted.key=value ...] --grid KEY=V1,V2 [--grid ...]
              [--seeds 0,1,2] --out DIR [--jobs N] [--ray-address HOST:PORT [--cpus-per-run C]] [--dry-run]
fedflex sweep scenarios/studies/NAME.yaml [dotted.key=value ...] [--grid ...] [--seeds ...]
              [--out DIR] [--jobs N] [--ray-address HOST:PORT [--cpus-per-run C]] [--dry-run]
fedflex compare DIR... [--by KEY ...] [--target ACC] [--budget-mb MB] [--metric NAME ...] [--field PATH ...]
              [--reference FILE] [--out DIR] [--include-incomplete] [--smooth W] [--smooth-order P]
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path

from fedflex.config import ConfigError
from fedflex.study.runs import StudyError

EXIT_USAGE = 2


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the sweep command's arguments to ``parser``."""
    parser.add_argument(
        "scenario", help="scenario YAML file, or a study file (scenarios/studies/: scenario:, variants:, grid:, seeds:)"
    )
    parser.add_argument("overrides", nargs="*", help="OmegaConf dotlist overrides for every run")
    parser.add_argument(
        "--grid", action="append", default=[], metavar="KEY=V1,V2", help="a grid axis (repeat for more axes)"
    )
    parser.add_argument("--seeds", help="seeds, e.g. 0,1,2 (default: the study file's, else the scenario's seed)")
    parser.add_argument("--out", help="sweep directory (default for a study file: runs/<study name>)")
    parser.add_argument(
        "--jobs",
        type=int,
        help="runs at a time, each on its share of the CPUs (default 1; with --ray-address: all, as Ray places them)",
    )
    parser.add_argument(
        "--ray-address",
        metavar="HOST:PORT",
        help="run each run as a task on this Ray cluster (its head's address, or auto); --out must be on a "
        "filesystem every node reaches at the same path, and fedflex and the data installed on every node",
    )
    parser.add_argument(
        "--cpus-per-run",
        type=int,
        metavar="C",
        help="with --ray-address: the CPUs each run asks Ray for (default 1)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="plan and check every run's config, print the runs, start nothing"
    )


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the compare command's arguments to ``parser``."""
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="run directories or directories holding runs")
    parser.add_argument(
        "--by",
        action="append",
        default=[],
        metavar="KEY",
        help="group by this config key (repeat; default: the keys in which the runs' config.yaml differ, seed aside)",
    )
    parser.add_argument("--target", type=float, help="report rounds to this test accuracy (raw and smoothed)")
    parser.add_argument(
        "--sustain",
        type=int,
        metavar="K",
        help="with --target: also rounds to it held for K evaluations in a row (a single noisy evaluation "
        "does not count)",
    )
    parser.add_argument(
        "--budget-mb",
        type=float,
        metavar="MB",
        help="also report the test accuracy at this byte budget: the last evaluated round whose messages so far "
        "(down and up, 10^6 bytes) fit in it",
    )
    parser.add_argument(
        "--metric", action="append", default=[], metavar="NAME", help="also plot this metrics.jsonl field (repeat)"
    )
    parser.add_argument(
        "--field",
        action="append",
        default=[],
        metavar="PATH",
        help="also tabulate this summary.json number, a dotted path (repeat; e.g. transitions.2.mean_online_accuracy)",
    )
    parser.add_argument(
        "--reference",
        metavar="FILE",
        help="a study file (or YAML) whose reference: numbers join the table as columns (a paper's figures)",
    )
    parser.add_argument("--out", help="where compare.md, compare.csv and the plots go (default: DIR/compare)")
    parser.add_argument("--include-incomplete", action="store_true", help="keep runs that did not complete")
    parser.add_argument("--smooth", type=int, default=13, metavar="W", help="Savitzky-Golay window (odd; default 13)")
    parser.add_argument("--smooth-order", type=int, default=3, metavar="P", help="its polynomial order (default 3)")


def _fail(message: str) -> int:
    print(f"fedflex: {message}", file=sys.stderr)
    return EXIT_USAGE


class _Once(logging.Filter):
    """Lets each distinct message through once (planning loads every member's config
    several times, and a scenario's warnings would repeat for each).
    """

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        new = message not in self.seen
        self.seen.add(message)
        return new


def sweep_command(args: argparse.Namespace) -> int:
    """``fedflex sweep``: plan (every member's config checked), then run what is left."""
    loader_log = logging.getLogger("fedflex.loader")  # the scenario warnings (warn_unused, warn_measured)
    once = _Once()
    loader_log.addFilter(once)
    try:
        return _sweep(args)
    finally:
        loader_log.removeFilter(once)


def _sweep(args: argparse.Namespace) -> int:
    from fedflex.study import sweep as sw

    try:
        if sw.is_study_file(Path(args.scenario)):
            study = sw.read_study(Path(args.scenario))
            scenario = study["scenario"]
            overrides = [*study["overrides"], *args.overrides]
            grid = {**study["grid"], **sw.parse_grid(args.grid)}
            seeds = sw.parse_seeds(args.seeds) if args.seeds else study["seeds"]
            out = args.out or study["out"] or str(Path("runs") / Path(args.scenario).stem)
            jobs = args.jobs or study["jobs"] or 1
            variants = study["variants"]
        else:
            if not args.out:
                return _fail("sweep needs --out DIR (a later sweep into it keeps what finished)")
            scenario, overrides, out, jobs = args.scenario, list(args.overrides), args.out, args.jobs or 1
            grid = sw.parse_grid(args.grid)
            seeds = sw.parse_seeds(args.seeds) if args.seeds else None
            variants = {}
        if args.cpus_per_run is not None and not args.ray_address:
            return _fail("--cpus-per-run: only with --ray-address (on this machine --jobs sets each run's share)")
        if args.cpus_per_run is not None and args.cpus_per_run < 1:
            return _fail(f"--cpus-per-run {args.cpus_per_run}: must be >= 1")
        sweep = sw.plan(Path(scenario), overrides, grid, seeds, Path(out), jobs, variants)
        if args.ray_address:
            sweep.ray_address = args.ray_address
            sweep.cpus_per_run = args.cpus_per_run or 1
            if not args.jobs and not (sw.is_study_file(Path(args.scenario)) and study["jobs"]):
                sweep.jobs = len(sweep.members)  # Ray queues what it cannot place yet
        from fedflex.strategies.combinations import load_checked  # the CLI wires both sides

        for member in sweep.members:
            try:
                load_checked(sweep.scenario, [*sweep.overrides, *member.overrides])
            except ConfigError as exc:
                raise ConfigError(exc.key, exc.value, f"{exc.allowed} (in sweep member {member.name})") from None
        sw.check_existing(sweep)
    except ConfigError as exc:
        return _fail(f"config error: {exc}")
    except StudyError as exc:
        return _fail(str(exc))
    print(f"sweep: {sw.describe(sweep)}", flush=True)
    if args.dry_run:
        for member in sweep.members:
            print(f"{member.name}: {' '.join(member.overrides)}")
        return 0
    try:
        code = sw.SweepRunner(sweep, say=lambda line: print(line, flush=True)).run()
    except StudyError as exc:
        return _fail(str(exc))
    print(f"sweep: index in {sweep.out / sw.INDEX_FILE}; compare with: fedflex compare {sweep.out}", file=sys.stderr)
    return code


def compare_command(args: argparse.Namespace) -> int:
    """``fedflex compare``: the Markdown table on stdout, files in ``--out``."""
    from fedflex.study.compare import write_comparison
    from fedflex.study.studyfile import read_reference

    if args.out:
        out = Path(args.out)
    elif len(args.dirs) == 1:
        out = Path(args.dirs[0]) / "compare"
    else:
        return _fail("compare of several directories: say where the tables and plots go with --out DIR")
    if args.target is not None and not 0 < args.target <= 1:
        return _fail(f"--target {args.target}: a test accuracy in (0, 1]")
    if args.sustain is not None and (args.target is None or args.sustain < 1):
        return _fail(f"--sustain {args.sustain}: a number of evaluations >= 1, with --target")
    if args.budget_mb is not None and not (math.isfinite(args.budget_mb) and args.budget_mb > 0):
        return _fail(f"--budget-mb {args.budget_mb}: a positive number of megabytes")
    if args.smooth < 3 or args.smooth % 2 == 0 or not 0 <= args.smooth_order < args.smooth:
        return _fail(f"--smooth {args.smooth} --smooth-order {args.smooth_order}: an odd window >= 3 above the order")
    by = [k for item in args.by for k in item.split(",") if k]
    metrics = [m for item in args.metric for m in item.split(",") if m]
    fields = [f for item in args.field for f in item.split(",") if f]
    try:
        reference = read_reference(Path(args.reference)) if args.reference else None
        text, written = write_comparison(
            args.dirs,
            out,
            by or None,
            args.target,
            metrics,
            args.include_incomplete,
            args.smooth,
            args.smooth_order,
            fields,
            reference,
            args.sustain,
            args.budget_mb,
        )
    except ConfigError as exc:
        return _fail(f"config error: {exc}")
    except StudyError as exc:
        return _fail(str(exc))
    print(text, end="")
    print(f"written: {', '.join(str(p) for p in written)}", file=sys.stderr)
    return 0
