"""Process supervision for local federations: executables, ports, process groups.

Every component runs in its own session / process group, with stdout and stderr in
``WORKDIR/logs/<name>.log``. Stopping one sends SIGTERM to its process group and to the
groups of all its descendants (Flower's SuperLink starts its SuperExec detached, in a
session of its own), waits a grace period, then sends SIGKILL to whatever is left.

No orphans: on Linux every component gets SIGKILL when the process that started it dies
(``PR_SET_PDEATHSIG``), so a killed ``fedflex deploy local`` takes its SuperLink and
SuperNodes with it; their own children (SuperExec, ServerApp, ClientApps) exit within
seconds by Flower's parent-process monitors. Descendants are remembered while they run
(:meth:`ManagedProcess.remember_family`), so the ServerApp of a SuperLink killed from
outside, re-parented to init, is still found and stopped with the rest.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

logger = logging.getLogger(__name__)


LOOPBACK = "127.0.0.1"


class DeployError(RuntimeError):
    """A federation could not be started, or a run could not be launched or finished."""


def find_executable(name: str) -> str:
    """Absolute path of a Flower executable: the interpreter's bin directory first.

    Raises
    ------
    DeployError
        When ``name`` is neither next to ``sys.executable`` nor on ``PATH``.
    """
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise DeployError(
            f"{name} not found next to {sys.executable} nor on PATH: install flwr 1.41 "
            "(pip install 'flwr[simulation]>=1.41,<1.42') or activate fedflex's virtual environment"
        )
    return found


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on ``host`` that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port_free(port: int, host: str = LOOPBACK, what: str = "port") -> None:
    """Raise :class:`DeployError` when ``host:port`` cannot be bound (someone uses it).

    SO_REUSEADDR as the SuperLink's server sets it: connections of a stopped SuperLink
    left in TIME_WAIT do not count, only a socket that still listens.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise DeployError(
                f"{what} {host}:{port} is in use ({exc.strerror}); choose another port or stop "
                "the process that holds it (e.g. an old flower-superlink)"
            ) from None


def port_open(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def link_transport(port: int, host: str = LOOPBACK, timeout: float = 3.0) -> Optional[str]:
    """Return what a SuperLink at ``host:port`` speaks: ``"tls"``, ``"http"`` (plain), or None
    (nothing accepts connections there, or the peer answers neither).

    A TLS handshake is attempted without verifying the certificate: a TLS server
    completes it; a plain HTTP server answers the ClientHello with an HTTP error (not a
    TLS record: ``WRONG_VERSION_NUMBER``) or closes the connection.
    """
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with context.wrap_socket(sock, server_hostname=host):
            return "tls"
    except ssl.SSLError as exc:
        reason = getattr(exc, "reason", "") or ""
        return (
            "http"
            if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "UNEXPECTED_EOF_WHILE_READING")
            else None
        )
    except OSError:
        return None
    finally:
        sock.close()


def transport_mismatch(link: Optional[str], node_tls: bool, address: str) -> Optional[str]:
    """Why a SuperNode (``node_tls``: started with ``--root-certificates``, else
    ``--insecure``) cannot talk to a SuperLink that speaks ``link``; None when they match
    or the link's transport is unknown.
    """
    if link == "tls" and not node_tls:
        return (
            f"the SuperLink at {address} speaks TLS but the SuperNode was started with --insecure (plain HTTP), "
            "so it retries for ever without a reason: give it --root-certificates CA.crt instead of --insecure"
        )
    if link == "http" and node_tls:
        return (
            f"the SuperLink at {address} speaks plain HTTP (--insecure) but the SuperNode expects TLS "
            "(--root-certificates): start both with TLS, or both with --insecure"
        )
    return None


def bindable(port: int) -> bool:
    """Whether ``port`` is free to bind on this machine (:func:`check_port_free` without the error)."""
    try:
        check_port_free(port)
        return True
    except DeployError:
        return False


def _proc_table() -> dict[int, tuple[int, int, int, str]]:
    """Return pid -> (ppid, pgid, start time, state) of every process (Linux /proc)."""
    table: dict[int, tuple[int, int, int, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read().decode(errors="replace")
        except OSError:
            continue
        rest = data[data.rfind(")") + 2 :].split()
        try:
            table[int(entry)] = (int(rest[1]), int(rest[2]), int(rest[19]), rest[0])
        except (IndexError, ValueError):
            continue
    return table


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _load_prctl():
    """Return libc's prctl on Linux (None elsewhere), looked up before any fork: the child
    between fork and exec must not import or load anything.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _load_prctl()


def _die_with_parent(parent: int):
    """Return a ``preexec_fn``: the child gets SIGKILL when ``parent`` (the starting thread's
    process) dies, and exits at once if it already has. None where unsupported.
    """
    if _PRCTL is None:
        return None
    prctl = _PRCTL

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl took effect
            os._exit(1)

    return preexec


def _descendants(pid: int, table: Mapping[int, tuple[int, int, int, str]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for p, (ppid, *_rest) in table.items():
        children.setdefault(ppid, []).append(p)
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


class ManagedProcess:
    """A process started in its own session, with its output in a log file.

    Parameters
    ----------
    name
        Short name (``superlink``, ``supernode-0``): the log file's stem.
    cmd, env
        Command line and environment.
    log_path
        Where stdout and stderr go (appended).
    """

    def __init__(
        self, name: str, cmd: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Optional[Path] = None
    ):
        self.name = name
        self.cmd = list(cmd)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            log.write(f"\n### {time.strftime('%H:%M:%S')} {shlex.join(self.cmd)}\n".encode())
            log.flush()
            self._log_start = log.tell()  # output() shows this start only
            self.popen = subprocess.Popen(  # noqa: S603 - our own command lines
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                cwd=str(cwd) if cwd else None,
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()),  # noqa: PLW1509 - one prctl, no locks
            )
        self.pid = self.popen.pid
        self.family: dict[int, int] = {}  # pid -> start time of every process seen under it
        self.groups: set[int] = {self.pid}
        logger.info("started %s (pid %d): %s", name, self.pid, shlex.join(self.cmd))

    # ---------------------------------------------------------------- state
    def alive(self) -> bool:
        """Return True while the process runs."""
        return self.popen.poll() is None

    @property
    def returncode(self) -> Optional[int]:
        """Return the exit status, or None while the process runs."""
        return self.popen.poll()

    def output(self) -> str:
        """Return what this process (this start) wrote to its log so far."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 15) -> str:
        """Return the last ``lines`` lines of the process's output."""
        return "\n".join(self.output().rstrip().splitlines()[-lines:])

    def remember_family(self, table: Optional[Mapping[int, tuple[int, int, int, str]]] = None) -> None:
        """Record the current descendants and their process groups (before signalling,
        and while the process runs: orphans are re-parented and could not be found
        afterwards). ``table``: a :func:`_proc_table` shared by several calls.
        """
        table = _proc_table() if table is None else table
        for p in _descendants(self.pid, table):
            ppid, pgid, start, _state = table[p]
            self.family[p] = start
            self.groups.add(pgid)
        own = os.getpgrp()
        self.groups -= {0, 1, own}

    def leftovers(self) -> list[int]:
        """Remembered descendants still running (not zombies, same start time)."""
        table = _proc_table()
        return [p for p, start in self.family.items() if p in table and table[p][2] == start and table[p][3] != "Z"]

    # ---------------------------------------------------------------- signals
    def _signal(self, sig: int) -> None:
        for group in sorted(self.groups):
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.leftovers():
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self) -> None:
        """SIGKILL the process and all its descendants at once (a crash), and reap it."""
        self.remember_family()
        self._signal(signal.SIGKILL)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            logger.warning("%s (pid %d) survived SIGKILL for 10 s", self.name, self.pid)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM to the process groups of the process and its descendants; SIGKILL
        after ``grace`` seconds for what is left. Idempotent.
        """
        stop_all([self], grace)

    def running(self) -> bool:
        """Return the process or a remembered descendant still runs."""
        return self.alive() or bool(self.leftovers())

    def reap(self) -> None:
        """Wait for the process to end (killing it after 10 s) so no zombie is left."""
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            logger.warning("%s (pid %d) survived SIGKILL for 10 s", self.name, self.pid)


def remember_families(processes: Sequence[ManagedProcess]) -> None:
    """:meth:`ManagedProcess.remember_family` of several processes with one scan of /proc."""
    table = _proc_table()
    for proc in processes:
        proc.remember_family(table)


def stop_all(processes: Sequence[ManagedProcess], grace: float = 5.0) -> None:
    """Stop several processes at once: SIGTERM to all, wait up to ``grace`` seconds for
    all, SIGKILL what is left (with everything it started), reap.
    """
    for proc in processes:
        proc.remember_family()
    running = [p for p in processes if p.running()]
    for proc in running:
        proc._signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while running and time.monotonic() < deadline:
        time.sleep(0.1)
        for proc in running:
            proc.remember_family()  # children started while shutting down
        running = [p for p in running if p.running()]
    for proc in running:
        logger.warning("%s did not stop within %.0f s of SIGTERM: SIGKILL", proc.name, grace)
        proc.remember_family()
        proc._signal(signal.SIGKILL)
    for proc in processes:
        proc.reap()


def wait_until(predicate, timeout: float, interval: float = 0.2) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
