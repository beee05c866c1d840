"""``fedflex`` command line.

    fedflex run SCENARIO.yaml [dotted.key=value ...] [--out DIR] [--verbose]

    fedflex deploy local [--nodes N] SCENARIO.yaml [dotted.key=value ...] [--out DIR] [--tls] [--auth]

    fedflex deploy check HOST:PORT [--root-certificates CA | --insecure]

    fedflex --version

    fedflex sweep SCENARIO.yaml [dotted.key=value ...] --grid KEY=V1,V2 [--grid ...] [--seeds 0,1,2]
                  --out DIR [--jobs N] [--ray-address HOST:PORT [--cpus-per-run C]]
    fedflex sweep scenarios/studies/NAME.yaml [--out DIR] [--jobs N] [--ray-address HOST:PORT]

    fedflex compare DIR... [--by KEY ...] [--target ACC] [--metric NAME ...] [--out DIR]
                  [--include-incomplete]

``sweep`` runs one ``fedflex run`` per grid point and seed into ``DIR/<key>=<value>,...,seed=<s>/``
(``--jobs N`` at a time, each on its share of the CPUs; with ``--ray-address`` as tasks on a Ray
cluster, ``DIR`` on a filesystem every node shares) and indexes them in ``DIR/sweep.json``;
run again, it keeps finished runs, resumes interrupted ones and reruns failed ones. Exit status
0 when every run finished (completed or diverged), 1 when one failed, 128 + N on signal N.
``compare`` groups runs by the config keys in which they differ (seed aside) or ``--by``, and
writes ``compare.md``, ``compare.csv`` and seed-banded curves (default ``DIR/compare/``);
see :mod:`fedflex.study`.

A bad key or value exits with status 2 and one line naming the key; nothing is written.

A run in which no round trained (every round skipped for too few online clients, or
without a usable reply), or stopped by ``churn.on_too_few=fail``, is a failed run:
``"status": "failed"`` and the reason as ``failure`` in summary.json, that reason as one
line, exit status 1.

Exit status: 0 completed (or stopped at ``evaluation.stop_at_accuracy``); 1 missing data
or a failed run; 2 a bad scenario, override, ``--out`` or checkpoint (nothing written);
3 the run diverged (``evaluation.stop_on_divergence``); 74 the results could not be
written (a full disk or quota: every file in DIR stays whole; resumable with ``fedflex
run --resume DIR`` once there is room, when a checkpoint was written); 128 + N stopped
by signal N (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP), resumable with ``fedflex run
--resume DIR``. A run holds a lock on its results directory: a second run (or
``--resume``) on it is refused with status 2 while the first one lasts.
"""

from __future__ import annotations

import argparse
import errno
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

from fedflex.config import ConfigError, load_scenario
from fedflex.results import CHECKPOINT_FILE, default_out_dir
from fedflex.rundir import RunDirError, RunDirLock

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DIVERGED = 3
EXIT_WRITE = 74  # sysexits.h EX_IOERR
#: write errors that end a run with EXIT_WRITE and one line (a full disk or quota)
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class _Version(argparse.Action):
    """``--version``: fedflex's version (and git commit in a checkout), asked for only
    when the option is given.
    """

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from fedflex.runinfo import version_line

        print(version_line())
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedflex", description="fedflex: composable Flower strategies for federations whose clients come and go."
    )
    parser.add_argument("--version", action=_Version, help="show fedflex's version (and git commit) and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a scenario in simulation (Flower + Ray)")
    run.add_argument("scenario", nargs="?", help="scenario YAML file (not with --resume)")
    run.add_argument("overrides", nargs="*", help="OmegaConf dotlist overrides, e.g. client.lr=0.05")
    run.add_argument("--out", help="results directory (default: runs/<name>-<timestamp>)")
    run.add_argument("--resume", metavar="DIR", help="continue a stopped run from DIR's last checkpoint")
    run.add_argument("--verbose", action="store_true", help="Flower's INFO logs and Ray's output")
    deploy = sub.add_parser("deploy", help="run a scenario on a real Flower federation (SuperLink + SuperNodes)")
    where = deploy.add_subparsers(dest="where", required=True)
    local = where.add_parser("local", help="a SuperLink and N SuperNodes as local processes on 127.0.0.1")
    from fedflex.launch.deploy import add_arguments, add_check_arguments  # light: no torch, no Flower

    add_arguments(local)
    check = where.add_parser(
        "check", help="can a SuperNode with these flags talk to the SuperLink at HOST:PORT (TLS or plain HTTP)?"
    )
    add_check_arguments(check)
    from fedflex.launch.study_cli import add_compare_arguments, add_sweep_arguments

    add_sweep_arguments(sub.add_parser("sweep", help="run a scenario over a grid of overrides and seeds"))
    add_compare_arguments(sub.add_parser("compare", help="tables and seed-banded curves over groups of runs"))
    return parser


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"fedflex: {message}", file=sys.stderr)
    return code


class _Stderr(logging.StreamHandler):
    """A handler on whatever ``sys.stderr`` is when a record is written (``main`` may run
    many times in one process, e.g. from tests, each with its own stderr).
    """

    @property
    def stream(self):  # noqa: D102
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ sets it: ignored
        pass


def _log_to_stderr(level: int) -> None:
    """Send the command's log lines to stderr, ``LEVEL name: message`` (once per process)."""
    root = logging.getLogger()
    if not any(isinstance(h, _Stderr) for h in root.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv``); return the exit status."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)  # overrides may also follow --out
    unknown = [r for r in rest if r.startswith("-")]
    takes_overrides = args.command in ("run", "sweep") or (args.command == "deploy" and args.where == "local")
    if unknown or (rest and not takes_overrides):
        parser.error("unrecognized arguments: " + " ".join(unknown or rest))
    if rest:
        args.overrides = [*args.overrides, *rest]
    _log_to_stderr(logging.INFO if getattr(args, "verbose", False) else logging.WARNING)
    if args.command == "run":
        return _run(args)
    if args.command == "deploy":
        from fedflex.launch.deploy import deploy_check, deploy_local

        return deploy_check(args) if args.where == "check" else deploy_local(args)
    if args.command in ("sweep", "compare"):
        from fedflex.launch.study_cli import compare_command, sweep_command

        return sweep_command(args) if args.command == "sweep" else compare_command(args)
    return _fail(f"unknown command {args.command}")


def _run(args: argparse.Namespace) -> int:
    if args.resume:
        return _resume(args)
    if not args.scenario:
        return _fail("run needs a SCENARIO file (or --resume DIR)")
    try:
        cfg = load_scenario(args.scenario, args.overrides)
        from fedflex.strategies.build import check_parts  # the CLI wires both sides

        check_parts(cfg)
    except ConfigError as exc:
        return _fail(f"config error: {exc}")
    out = Path(args.out) if args.out else (Path(cfg.output.dir) if cfg.output.dir else default_out_dir(cfg.name))
    lock = RunDirLock(out, new=True)
    try:
        lock.acquire()  # creates out; refuses a busy or non-empty one (nothing written)
    except RunDirError as exc:
        return _fail(str(exc))
    try:
        return _execute(cfg, out, args.verbose)
    finally:
        lock.release()


def _execute(cfg, out: Path, verbose: bool, resume: Optional[dict] = None) -> int:
    """Run (or resume) ``cfg`` into ``out`` under the held lock: the exit status, with one
    line for missing data, a configuration found bad with the data, or a full disk.
    """
    from fedflex.data import DataNotFoundError
    from fedflex.launch import runner  # imports torch and Flower: after the cheap checks

    try:
        with _interruptible():
            runner.run(cfg, out, verbose=verbose, resume=resume)
    except DataNotFoundError as exc:
        return _fail(str(exc), code=1)
    except ConfigError as exc:  # found with the data: a missing column, num_clients vs natural clients
        return _fail(f"config error: {exc}")
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        return _write_failed(out, exc)
    return _finished(out)


def _write_failed(out: Path, exc: OSError) -> int:
    """Return the one line of a run that could not write its results (a full disk)."""
    where = f" ({exc.filename})" if exc.filename else ""
    if (out / CHECKPOINT_FILE).is_file():
        then = f"make room and continue with: fedflex run --resume {out}"
    else:
        then = "no checkpoint was written, so nothing can be resumed: make room and start the run again"
    return _fail(f"cannot write the results in {out}: {exc.strerror or exc}{where}; {then}", code=EXIT_WRITE)


class _interruptible:
    """SIGINT / SIGTERM / SIGHUP stop the run at a round boundary (fedflex.interrupts)."""

    def __enter__(self) -> None:
        from fedflex import interrupts

        interrupts.install()

    def __exit__(self, *exc) -> None:
        from fedflex import interrupts

        if interrupts.requested() is None:  # after a first signal, a second one still exits at once
            interrupts.uninstall()


def _finished(out: Path) -> int:
    """Return the exit status and last line of a run, from its summary.json."""
    import json

    from fedflex import interrupts

    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    status = summary.get("status")
    last = summary.get("last_round")
    if status == "interrupted" or interrupts.requested() is not None:
        signum = interrupts.requested() or 2
        if (out / CHECKPOINT_FILE).is_file():
            print(
                f"fedflex: interrupted after round {last}; results so far in {out}; "
                f"continue with: fedflex run --resume {out}",
                file=sys.stderr,
            )
        else:
            print(f"fedflex: interrupted before a round completed; nothing to resume in {out}", file=sys.stderr)
        return interrupts.exit_code(signum)
    if status == "failed" and summary.get("failure"):
        print(f"fedflex: the run failed: {summary['failure']}; results in {out}", file=sys.stderr)
        return EXIT_FAILED
    if status == "diverged":
        print(
            f"fedflex: diverged in round {summary.get('diverged_round')}: {summary.get('divergence')}; "
            f"results up to it in {out}",
            file=sys.stderr,
        )
        return EXIT_DIVERGED
    print(f"results: {out}", file=sys.stderr)
    return 0


def _resume(args: argparse.Namespace) -> int:
    out = Path(args.resume)
    if args.scenario or args.overrides or args.out:
        return _fail(
            "--resume DIR takes no scenario, overrides or --out: the run continues as configured in DIR/config.yaml"
        )
    from fedflex.strategies.server_app import RunConfigError, resume_point

    try:
        resume_point(out, option="--resume ")  # a run directory, before the lock file goes there
    except RunConfigError as exc:
        return _fail(str(exc))
    lock = RunDirLock(out, new=False, option="--resume")
    try:
        lock.acquire()
    except RunDirError as exc:
        return _fail(str(exc))
    try:
        try:
            cfg, checkpoint = resume_point(out, option="--resume ")  # as the last holder left it
        except RunConfigError as exc:
            return _fail(str(exc))
        done = checkpoint["round"] >= cfg.rounds
        print(
            f"resuming {out} after round {checkpoint['round']}"
            + (": all rounds ran; writing the final model and summary.json" if done else ""),
            file=sys.stderr,
        )
        return _execute(cfg, out, args.verbose, resume=checkpoint)
    finally:
        lock.release()


if __name__ == "__main__":
    sys.exit(main())
