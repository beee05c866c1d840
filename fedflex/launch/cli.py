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
0 when every run finished (completed, degraded or diverged), 1 when one failed, 128 + N on
signal N.
``compare`` groups runs by the config keys in which they differ (seed aside) or ``--by``, and
writes ``compare.md``, ``compare.csv`` and seed-banded curves (default ``DIR/compare/``);
see :mod:`fedflex.study`.

A bad key or value exits with status 2 and one line naming the key; nothing is written.

A run in which no round trained (every round skipped for too few online clients, or
without a usable reply), or stopped by ``churn.on_too_few=fail``, is a failed run:
``"status": "failed"`` and the reason as ``failure`` in summary.json, that reason as one
line, exit status 1.

A run that ran its rounds but in some of them trained nothing because every reply was
rejected is ``"status": "degraded"`` (the rounds in ``rejected_rounds``), one line, exit
status 1.

Exit status: 0 completed (or stopped at ``evaluation.stop_at_accuracy``); 1 missing data,
a failed or a degraded run; 2 a bad scenario, override, ``--out`` or checkpoint (one that
is damaged or does not belong to the run: nothing written); 3 the run diverged
(``evaluation.stop_on_divergence``); 74 the results could not be written (a full disk or
quota, a read-only or failing file system, lost permissions: every file in DIR stays
whole; ``fedflex run --resume DIR`` once the cause is gone); 128 + N stopped by signal N
(130 Ctrl-C, 143 SIGTERM, 129 SIGHUP), resumable with ``fedflex run --resume DIR`` (a
second signal exits at once, after writing the checkpoint of the last round boundary).
``--resume`` of a run that wrote no checkpoint runs it again from round 1 in place. A run
holds a lock on its results directory: a second run (or ``--resume``) on it is refused
with status 2 while the first one lasts.
"""

from __future__ import annotations

import argparse
import errno
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

import fedflex
from fedflex.config import ConfigError
from fedflex.loader import load_scenario
from fedflex.results import CHECKPOINT_FILE, CONFIG_FILE, SUMMARY_FILE, default_out_dir
from fedflex.rundir import RunDirError, RunDirLock
from fedflex.runinfo import command_clock, log_outcome

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DIVERGED = 3
EXIT_WRITE = 74  # sysexits.h EX_IOERR
#: a full disk or quota: "make room"
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
#: I/O errors that end a run with EXIT_WRITE and one line (every file whole, resumable)
IO_ERRNOS = WRITE_ERRNOS | {errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM}


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


def other_checkout(cwd: Path) -> Optional[Path]:
    """Return the fedflex checkout ``cwd`` is in when the running fedflex is not that
    checkout's code (one shared venv whose editable install points at another clone), else None.
    """
    mine = Path(fedflex.__file__).resolve().parent.parent
    for folder in (cwd, *cwd.parents):
        if all((folder / name).exists() for name in ("pyproject.toml", "fedflex/__init__.py", "strategies")):
            return None if folder.resolve() == mine else folder
    return None


def _warn_other_checkout() -> None:
    other = other_checkout(Path.cwd())
    if other is not None:
        logging.getLogger(__name__).warning(
            "this fedflex runs the code of %s, not of the checkout you are in (%s): "
            "`bash scripts/setup.sh` there points the venv at it (FEDFLEX_VENV=DIR gives a checkout its own venv)",
            Path(fedflex.__file__).resolve().parent.parent,
            other,
        )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv``); return the exit status."""
    # run_wall_s counts the command's start-up too; from the process's start when this is
    # the `fedflex` executable (argv None), not a call from a running program
    with command_clock(from_process_start=argv is None):
        return _command(argv)


def _command(argv: Optional[Sequence[str]]) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)  # overrides may also follow --out
    unknown = [r for r in rest if r.startswith("-")]
    takes_overrides = args.command in ("run", "sweep") or (args.command == "deploy" and args.where == "local")
    if unknown or (rest and not takes_overrides):
        parser.error("unrecognized arguments: " + " ".join(unknown or rest))
    if rest:
        args.overrides = [*args.overrides, *rest]
    _log_to_stderr(logging.INFO if getattr(args, "verbose", False) else logging.WARNING)
    _warn_other_checkout()
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
        from fedflex.strategies.combinations import load_checked  # the CLI wires both sides

        cfg = load_checked(args.scenario, args.overrides)
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


def _execute(cfg, out: Path, verbose: bool, resume: Optional[dict] = None, announce: str = "") -> int:
    """Run (or resume) ``cfg`` into ``out`` under the held lock: the exit status, with one
    line for missing data, a configuration found bad with the data, a checkpoint whose
    model is not the config's, or an I/O error of the results directory. ``announce``:
    said (and logged in run.log) once the run passed its checks, before it writes.
    """

    def ready() -> None:
        if announce:
            print(announce, file=sys.stderr)
            log_outcome(out, logging.INFO, announce)

    from fedflex.data import DataNotFoundError
    from fedflex.launch import runner  # imports torch and Flower: after the cheap checks
    from fedflex.results import CheckpointError

    try:
        with _interruptible(out):
            runner.run(cfg, out, verbose=verbose, resume=resume, ready=ready)
    except DataNotFoundError as exc:
        return _fail(str(exc), code=1)
    except ConfigError as exc:  # found with the data: a missing column, num_clients vs natural clients
        return _fail(f"config error: {exc}")
    except CheckpointError as exc:  # found with the data: the model the config builds
        return _fail(f"--resume {out}: {exc}; it cannot be resumed; nothing was changed")
    except OSError as exc:
        if exc.errno not in IO_ERRNOS and not _inside(exc.filename, out):
            raise
        return _write_failed(out, exc)
    return _finished(out)


def _inside(filename, out: Path) -> bool:
    """Whether ``filename`` (of an OSError) is ``out`` or a file in it."""
    if not filename or not isinstance(filename, (str, Path)):
        return False
    try:
        path, top = Path(filename).resolve(), out.resolve()
    except (OSError, RuntimeError):
        return False
    return path == top or top in path.parents


def _write_failed(out: Path, exc: OSError) -> int:
    """Return the one line of a run that ended on an I/O error of its results directory
    (a full disk, a read-only or failing file system, lost permissions): what to do once
    the cause is gone, with a command that works.
    """
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.filename and not _inside(exc.filename, out):  # not the results: the partition cache, say
        return _fail(f"I/O error{where}: {exc.strerror or exc}; the results in {out} stay whole", code=EXIT_WRITE)
    if exc.errno in WRITE_ERRNOS:
        once = "make room and "
    elif exc.errno == errno.EIO:
        once = "once the device works again, "
    else:
        once = f"once {out} can be written again, "
    if (out / CHECKPOINT_FILE).is_file():
        then = f"{once}continue with: fedflex run --resume {out}"
    elif (out / CONFIG_FILE).is_file():
        then = f"no checkpoint was written yet: {once}start it over in place with: fedflex run --resume {out}"
    elif not out.exists() or not any(out.iterdir()):
        then = f"no checkpoint was written, so nothing can be resumed: {once}start the run again"
    else:
        then = f"no checkpoint was written, so nothing can be resumed: {once}remove {out} and start the run again"
    line = f"cannot write the results in {out}: {exc.strerror or exc}{where}; {then}"
    log_outcome(out, logging.ERROR, line)
    return _fail(line, code=EXIT_WRITE)


class _interruptible:
    """SIGINT / SIGTERM / SIGHUP stop the run at a round boundary (fedflex.interrupts); a
    second one exits at once, after writing the last round boundary's checkpoint, saying
    how to continue, also in ``out/run.log``.
    """

    def __init__(self, out: Path) -> None:
        self.out = out

    def __enter__(self) -> None:
        from fedflex import interrupts

        interrupts.install()
        interrupts.add_exit_hook(self._how_to_continue)
        interrupts.add_exit_sink(lambda line: log_outcome(self.out, logging.WARNING, line))

    def _how_to_continue(self) -> str:
        if (self.out / CHECKPOINT_FILE).is_file():
            return f"continue with: fedflex run --resume {self.out}"
        if (self.out / CONFIG_FILE).is_file():
            return f"no checkpoint was written yet: start it over in place with: fedflex run --resume {self.out}"
        return f"nothing to resume: remove {self.out} and start the run again"

    def __exit__(self, *exc) -> None:
        from fedflex import interrupts

        if interrupts.requested() is None:  # after a first signal, a second one still exits at once
            interrupts.uninstall()


def _finished(out: Path) -> int:
    """Return the exit status and last line of a run, from its summary.json."""
    import json

    from fedflex import interrupts

    try:
        summary = json.loads((out / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        summary = {}
    status = summary.get("status")
    last = summary.get("last_round")

    def say(level: int, line: str, code: int, logged: Optional[str] = None) -> int:
        print(line, file=sys.stderr)
        log_outcome(out, level, logged or line.removeprefix("fedflex: "))
        return code

    if status == "interrupted" or interrupts.requested() is not None:
        signum = interrupts.requested() or 2
        by = summary.get("interrupted_by") or interrupts.signal_name(signum)
        if (out / CHECKPOINT_FILE).is_file():
            then = f"continue with: fedflex run --resume {out}"
            line = f"fedflex: interrupted after round {last}; results so far in {out}; {then}"
            logged = f"interrupted by {by} after round {last}; {then}"
        else:
            then = f"start it over in place with: fedflex run --resume {out}"
            line = f"fedflex: interrupted before its first checkpoint; {then}"
            logged = f"interrupted by {by} before its first checkpoint; {then}"
        return say(logging.WARNING, line, interrupts.exit_code(signum), logged)
    if status == "failed" and summary.get("failure"):
        return say(logging.ERROR, f"fedflex: the run failed: {summary['failure']}; results in {out}", EXIT_FAILED)
    if status == "diverged":
        causes = summary.get("divergence_causes") or []
        likely = f"; likely: {causes[0]}" if causes else ""
        line = (
            f"fedflex: diverged in round {summary.get('diverged_round')}: {summary.get('divergence')}{likely}; "
            f"results up to it in {out}"
        )
        return say(logging.ERROR, line, EXIT_DIVERGED)
    if status == "degraded":
        line = f"fedflex: the run did not complete: {summary.get('degraded')}; results in {out}"
        return say(logging.ERROR, line, EXIT_FAILED)
    return say(logging.INFO, f"results: {out}", 0)


def _resume(args: argparse.Namespace) -> int:
    out = Path(args.resume)
    if args.scenario or args.overrides or args.out:
        return _fail(
            "--resume DIR takes no scenario, overrides or --out: the run continues as configured in DIR/config.yaml"
        )
    from fedflex.launch.server import RunConfigError, resume_point

    if not _has_checkpoint(out):
        return _start_over(out, args.verbose)
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
        announce = f"resuming {out} after round {checkpoint['round']}" + (
            ": all rounds ran; writing the final model and summary.json" if done else ""
        )
        return _execute(cfg, out, args.verbose, resume=checkpoint, announce=announce)
    finally:
        lock.release()


def _has_checkpoint(out: Path) -> bool:
    from fedflex.results import LEGACY_CHECKPOINT_FILE

    return (out / CHECKPOINT_FILE).is_file() or (out / LEGACY_CHECKPOINT_FILE).is_file()


def _start_point(out: Path):
    """Return the config of a run in ``out`` that wrote no checkpoint (stopped before its
    first one, e.g. by a second Ctrl-C or a full disk), to run again from round 1 in place;
    or the one line why it cannot be.
    """
    from fedflex.study.runs import read_summary

    if not out.is_dir():
        return None, f"--resume {out}: no such directory"
    if not (out / CONFIG_FILE).is_file():
        return None, f"--resume {out}: no {CHECKPOINT_FILE} and no {CONFIG_FILE} there: not a fedflex run directory"
    try:
        cfg = load_scenario(out / CONFIG_FILE)
    except ConfigError as exc:
        return None, f"config error in {out / CONFIG_FILE}: {exc}"
    summary = read_summary(out) or {}
    if summary.get("status") not in (None, "failed", "interrupted") and (out / "model.npz").is_file():
        return None, f"--resume {out}: the run already ended ({summary.get('status')}) and wrote no checkpoint"
    return cfg, None


def _start_over(out: Path, verbose: bool) -> int:
    """``--resume`` of a run that wrote no checkpoint: run it again from round 1 in place,
    as configured in its config.yaml (the rows it wrote are run again, as a resume runs
    again the rows after its checkpoint).
    """
    cfg, problem = _start_point(out)
    if problem:
        return _fail(problem)
    lock = RunDirLock(out, new=False, option="--resume")
    try:
        lock.acquire()
    except RunDirError as exc:
        return _fail(str(exc))
    try:
        cfg, problem = _start_point(out)  # as the last holder left it
        if problem or _has_checkpoint(out):
            return _fail(problem or f"--resume {out}: a checkpoint appeared meanwhile: resume again")
        from fedflex.results import read_metrics

        try:
            rows = len(read_metrics(out))
        except (OSError, ValueError):
            rows = 0
        again = f" (its {rows} row{'s' if rows != 1 else ''} run again)" if rows else ""
        return _execute(cfg, out, verbose, announce=f"resuming {out} from the start: it wrote no checkpoint{again}")
    finally:
        lock.release()


if __name__ == "__main__":
    sys.exit(main())
