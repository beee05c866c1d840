"""The ``fedflex deploy local`` command line: arguments, progress lines, exit codes."""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

from fedflex.launch.deploy.certs import TlsFiles, make_certificates
from fedflex.launch.deploy.federation import LocalFederation
from fedflex.launch.deploy.processes import DeployError, find_executable

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fedflex deploy local``."""
    parser.add_argument("scenario", help="scenario YAML file")
    parser.add_argument("overrides", nargs="*", help="OmegaConf dotlist overrides, e.g. rounds=5")
    parser.add_argument("--nodes", type=int, help="number of SuperNodes (default: the scenario's num_clients)")
    parser.add_argument("--out", help="results directory (default: runs/<name>-<timestamp>)")
    parser.add_argument("--tls", action="store_true", help="HTTPS with certificates from scripts/make_certs.sh")
    parser.add_argument(
        "--auth", action="store_true", help="SuperNode authentication with registered EC keys (implies --tls)"
    )
    parser.add_argument("--certs", help="use the certificates and keys in this directory (make_certs.sh's layout)")
    parser.add_argument("--port", type=int, help="SuperLink port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--data-path", help="data-path node config of every SuperNode (dataset root)")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds the run may take (default 7200)")
    parser.add_argument("--workdir", help="logs and FLWR_HOMEs (default: a temporary directory, kept on failure)")
    parser.add_argument("--verbose", action="store_true", help="progress of the start-up and the run's log lines")


def deploy_local(args: argparse.Namespace) -> int:
    """``fedflex deploy local``: start, run, stop. Returns the exit status."""
    from fedflex.config import ConfigError, load_scenario
    from fedflex.results import default_out_dir, unusable_out_dir

    try:
        cfg = load_scenario(args.scenario, args.overrides)
    except ConfigError as exc:
        return _fail(f"config error: {exc}")
    nodes = args.nodes if args.nodes is not None else cfg.num_clients
    if nodes != cfg.num_clients:
        return _fail(
            f"--nodes {nodes} but the scenario has num_clients={cfg.num_clients}: every SuperNode holds one "
            f"client id; add the override num_clients={nodes} or drop --nodes"
        )
    out = Path(args.out) if args.out else (Path(cfg.output.dir) if cfg.output.dir else default_out_dir(cfg.name))
    out = out.resolve()
    problem = unusable_out_dir(out)
    if problem:
        return _fail(problem)
    try:
        for exe in ("flower-superlink", "flower-supernode", "flwr"):
            find_executable(exe)
    except DeployError as exc:
        return _fail(str(exc), 1)

    workdir = Path(args.workdir).resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="fedflex-deploy-"))
    tls_wanted = args.tls or args.auth
    restore = _terminate_as_interrupt()
    fed: Optional[LocalFederation] = None
    ok = False
    t0 = time.monotonic()
    try:
        tls, keys_dir = None, None
        if tls_wanted:
            if args.certs:
                tls, keys_dir = TlsFiles.from_dir(Path(args.certs)), Path(args.certs).resolve() / "keys"
            else:
                tls = make_certificates(workdir / "certs", num_keys=nodes if args.auth else 0)
        fed = LocalFederation(
            workdir,
            nodes,
            tls=tls,
            auth=args.auth,
            keys_dir=keys_dir,
            superlink_port=args.port,
            data_path=args.data_path,
        )
        _say(
            f"starting a SuperLink on {fed.address} ({'TLS' if tls else 'insecure'}"
            f"{', node auth' if args.auth else ''}) and {nodes} SuperNode(s); logs in {fed.logs}"
        )
        fed.start()
        _say(f"federation up after {time.monotonic() - t0:.1f} s; flwr run {cfg.name}")
        on_line = (lambda line: print(line, file=sys.stderr)) if args.verbose else _progress_lines
        result = fed.run(args.scenario, args.overrides, out, timeout=args.timeout, on_line=on_line)
        ok = result.ok
        if not ok:
            return _fail(
                f"run {result.run_id} ended with status {result.status} {result.details}; logs in {fed.logs}", 1
            )
        _say(f"run {result.run_id} completed in {result.wall_s:.1f} s")
        print(f"results: {out}", file=sys.stderr)
        return 0
    except DeployError as exc:
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        return _fail("interrupted: stopping the federation", 130)
    finally:
        try:
            if fed is not None:
                fed.stop()
                left = fed.leftovers()
                if left:
                    logger.warning("processes still running after stop: %s", left)
        finally:
            restore()
            if ok and not args.workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            elif not ok:
                print(f"fedflex: logs kept in {workdir}", file=sys.stderr)


def _progress_lines(line: str) -> None:
    """Show the ServerApp's per-round lines (``round 3/20 acc=...``) and errors."""
    text = line.strip()
    if text.startswith("round ") or "ERROR" in text or "Traceback" in text:
        print(text, file=sys.stderr)


def _terminate_as_interrupt():
    """SIGTERM behaves like Ctrl-C (so the federation is stopped); returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _say(message: str) -> None:
    print(f"fedflex: {message}", file=sys.stderr)


def _fail(message: str, code: int = 2) -> int:
    print(f"fedflex: {message}", file=sys.stderr)
    return code
