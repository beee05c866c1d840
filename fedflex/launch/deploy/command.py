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
from fedflex.launch.deploy.processes import DeployError, find_executable, link_transport, transport_mismatch
from fedflex.results import CHECKPOINT_FILE

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fedflex deploy local``."""
    parser.add_argument("scenario", nargs="?", help="scenario YAML file (not with --resume)")
    parser.add_argument("overrides", nargs="*", help="OmegaConf dotlist overrides, e.g. rounds=5")
    parser.add_argument("--nodes", type=int, help="number of SuperNodes (default: the scenario's num_clients)")
    parser.add_argument("--out", help="results directory (default: runs/<name>-<timestamp>); never overwritten")
    parser.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run whose results are in DIR from its last checkpoint, on a fresh federation",
    )
    parser.add_argument("--tls", action="store_true", help="HTTPS with certificates from scripts/make_certs.sh")
    parser.add_argument(
        "--auth", action="store_true", help="SuperNode authentication with registered EC keys (implies --tls)"
    )
    parser.add_argument("--certs", help="use the certificates and keys in this directory (make_certs.sh's layout)")
    parser.add_argument("--port", type=int, help="SuperLink port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--data-path", help="data-path node config of every SuperNode (dataset root)")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds the run may take (default 7200)")
    parser.add_argument(
        "--workdir",
        help="logs and FLWR_HOMEs (default: a temporary directory, removed on success; on failure its logs "
        "are kept and its keys removed)",
    )
    parser.add_argument("--verbose", action="store_true", help="progress of the start-up and the run's log lines")


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fedflex deploy check``."""
    parser.add_argument("address", help="the SuperLink's HOST:PORT, as a SuperNode's --superlink names it")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--root-certificates", metavar="CA", help="the CA file the SuperNode trusts (TLS)")
    mode.add_argument("--insecure", action="store_true", help="the SuperNode uses plain HTTP")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the SuperLink (default 5)")


def deploy_check(args: argparse.Namespace) -> int:
    """``fedflex deploy check``: can a SuperNode started with these flags talk to the
    SuperLink at ADDRESS? (transport, and with ``--root-certificates`` the certificate).
    Exit status 0 when it can, 1 when not (the reason on stderr), 2 for a bad address.
    """
    host, sep, port_text = args.address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit():
        return _fail(f"address {args.address!r}: expected HOST:PORT")
    port = int(port_text)
    link = link_transport(port, host, timeout=args.timeout)
    if link is None:
        return _fail(
            f"nothing answers at {args.address} (SuperLink not running, wrong port, or a firewall in between)", 1
        )
    described = "TLS" if link == "tls" else "plain HTTP (--insecure)"
    if args.root_certificates or args.insecure:
        why = transport_mismatch(link, bool(args.root_certificates), args.address)
        if why:
            return _fail(why, 1)
    if link == "tls" and args.root_certificates:
        problem = _verify_certificate(host, port, Path(args.root_certificates), args.timeout)
        if problem:
            return _fail(problem, 1)
        described += f", certificate valid for {host} and signed by {args.root_certificates}"
    _print(f"fedflex: the SuperLink at {args.address} speaks {described}")
    return 0


def _verify_certificate(host: str, port: int, ca_file: Path, timeout: float) -> Optional[str]:
    """Why a SuperNode trusting ``ca_file`` would refuse the SuperLink's certificate."""
    import socket
    import ssl

    try:
        context = ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        return f"--root-certificates {ca_file}: cannot be read as a CA certificate ({exc})"
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            with context.wrap_socket(sock, server_hostname=host):
                return None
    except ssl.SSLCertVerificationError as exc:
        return (
            f"the SuperLink's certificate is refused: {exc.verify_message} (is {host} among the names given to "
            "make_certs.sh, and is this the CA that signed it?)"
        )
    except (OSError, ssl.SSLError) as exc:
        return f"TLS handshake with {host}:{port} failed: {exc}"


def deploy_local(args: argparse.Namespace) -> int:
    """``fedflex deploy local``: start, run, stop. Returns the exit status."""
    from fedflex.config import ConfigError
    from fedflex.results import default_out_dir, unusable_out_dir

    resume: Optional[Path] = None
    if args.resume:
        if args.scenario or args.overrides or args.out:
            return _fail("--resume DIR takes no scenario, overrides or --out: the run continues as configured in DIR")
        from fedflex.launch.server import RunConfigError, resume_point

        try:
            cfg, checkpoint = resume_point(Path(args.resume), option="--resume ")
        except RunConfigError as exc:
            return _fail(str(exc))
        resume = Path(args.resume).resolve()
        _say(f"resuming {resume} after round {checkpoint['round']} of {cfg.rounds}")
    elif not args.scenario:
        return _fail("deploy local needs a SCENARIO file (or --resume DIR)")
    else:
        try:
            from fedflex.strategies.combinations import load_checked  # the launcher wires both sides

            cfg = load_checked(args.scenario, args.overrides)  # before any process starts
        except ConfigError as exc:
            return _fail(f"config error: {exc}")
    nodes = args.nodes if args.nodes is not None else cfg.num_clients
    if nodes != cfg.num_clients:
        return _fail(
            f"--nodes {nodes} but the scenario has num_clients={cfg.num_clients}: every SuperNode holds one "
            f"client id; add the override num_clients={nodes} or drop --nodes"
        )
    if resume is not None:
        out = resume
    else:
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
    restore, received = _stop_signals_as_interrupt()
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
        if not args.auth:
            _say(UNAUTHENTICATED)
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
        on_line = _print if args.verbose else _progress_lines
        result = fed.run(args.scenario or "", args.overrides, out, timeout=args.timeout, on_line=on_line, resume=resume)
        ok = result.ok
        if not ok:
            again = (
                f"; continue it with: fedflex deploy local --resume {out}" if (out / CHECKPOINT_FILE).is_file() else ""
            )
            return _fail(
                f"run {result.run_id} ended with status {result.status} {result.details}; logs in {fed.logs}{again}", 1
            )
        degraded = _degraded(out)
        if degraded:  # every round ran, but not as bound: refused nodes, rejected replies
            ok = False
            return _fail(f"run {result.run_id}: the run did not complete: {degraded}; results in {out}", 1)
        _say(f"run {result.run_id} completed in {result.wall_s:.1f} s")
        _print(f"results: {out}")
        return 0
    except DeployError as exc:
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        signum = received[0] if received and received[0] > 0 else signal.SIGINT
        again = f"; continue with: fedflex deploy local --resume {out}" if (out / CHECKPOINT_FILE).is_file() else ""
        return _fail(f"interrupted by {signal.Signals(signum).name}: stopping the federation{again}", 128 + signum)
    finally:
        received.append(0)  # from here on, signals wait for the stopping to end
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
                removed = ""
                if not args.workdir and (workdir / "certs").exists():
                    # the CA's, the SuperLink's and the SuperNodes' private keys: not left in /tmp
                    shutil.rmtree(workdir / "certs", ignore_errors=True)
                    removed = " (its certificates and keys removed)"
                _print(f"fedflex: logs kept in {workdir}{removed}")


UNAUTHENTICATED = (
    "warning: without --auth the SuperLink is plain HTTP with no node authentication: any local user can join "
    "SuperNodes to it and list, stop and start runs with flwr; --auth adds TLS and registered node keys (Flower "
    "1.41 has no user authentication for flwr ls/stop/run: see docs/deployment.md)"
)


def _degraded(out: Path) -> Optional[str]:
    """Why a run whose ServerApp ended normally is not ``completed`` (summary.json's
    ``degraded``: nodes the key binding refused, rounds whose replies were all rejected);
    None when it is, or when summary.json cannot be read.
    """
    from fedflex.study.runs import read_summary

    summary = read_summary(out) or {}
    if summary.get("status") != "degraded":
        return None
    return str(summary.get("degraded") or "degraded")


def _progress_lines(line: str) -> None:
    """Show the ServerApp's per-round lines (``round 3/20 acc=...``) and errors."""
    text = line.strip()
    if text.startswith("round ") or "ERROR" in text or "Traceback" in text:
        _print(text)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop_signals_as_interrupt():
    """SIGINT (Ctrl-C), SIGTERM and SIGHUP (a closed terminal, a dropped SSH session)
    raise KeyboardInterrupt once, so the federation is stopped; later ones are ignored
    until then, so that they cannot cut the stopping short and leave processes behind.
    Returns (the undo, the list that receives the first signal's number); append 0 to it
    to ignore every later signal (the stopping has begun).
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        return (lambda: None), received

    def handler(signum, frame):
        if received:
            return  # already stopping
        received.append(signum)
        if signum > 0:
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore, received


def _print(message: str) -> None:
    """Print a line on stderr; a terminal that is gone (SIGHUP: EIO) does not stop the stopping."""
    try:
        print(message, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _say(message: str) -> None:
    _print(f"fedflex: {message}")


def _fail(message: str, code: int = 2) -> int:
    _print(f"fedflex: {message}")
    return code
