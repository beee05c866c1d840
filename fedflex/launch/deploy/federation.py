"""A SuperLink and N SuperNodes on loopback, and a scenario run on them with ``flwr run``.

:class:`LocalFederation` is a context manager: its processes are stopped on normal exit,
on errors and on Ctrl-C. The commands it starts are the ones a multi-machine deployment
uses (``docs/deployment.md``).

It is over 600 lines because one class supervises every process of a local federation
(start, readiness, logs, stop on every exit path), and those steps share its state.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from fedflex.launch.deploy.certs import REPO_ROOT, TlsFiles
from fedflex.launch.deploy.processes import (
    LOOPBACK,
    DeployError,
    ManagedProcess,
    bindable,
    check_port_free,
    find_executable,
    free_port,
    link_transport,
    port_open,
    remember_families,
    stop_all,
    transport_mismatch,
    wait_until,
)
from fedflex.node_keys import KeyBindingError, write_binding
from fedflex.results import SUMMARY_FILE
from fedflex.runinfo import git_commit

logger = logging.getLogger(__name__)


CONNECTION = "fedflex-local"


SUPERNODE_READY = "SuperNode ID:"


def node_config(partition_id: int, num_partitions: int, data_path: Optional[str] = None) -> str:
    """Return the ``--node-config`` string of a fedflex SuperNode."""
    items = [f"partition-id={partition_id}", f"num-partitions={num_partitions}"]
    if data_path:
        if '"' in data_path or " " in data_path:
            raise DeployError(f"data path {data_path!r}: spaces and quotes are not supported in node configs")
        items.append(f'data-path="{data_path}"')
    return " ".join(items)


def run_config(
    scenario: str,
    overrides: Sequence[str] = (),
    out: str = "",
    resume: str = "",
    node_keys: str = "",
    git: Optional[dict[str, Any]] = None,
) -> str:
    """Return the ``--run-config`` string for fedflex's ServerApp (``scenario``, ``overrides``,
    ``out``; or ``resume``: a results directory whose run continues from its checkpoint;
    ``node_keys``: a binding file of partition ids to node keys, see
    :mod:`fedflex.node_keys`; ``git``: the app checkout's commit, :func:`fedflex.runinfo.git_commit`,
    which the ServerApp, running from the app bundle, cannot read itself).
    """
    if resume:
        values = {"resume": resume}
    else:
        values = {"scenario": scenario, "overrides": " ".join(shlex.quote(o) for o in overrides), "out": out}
    if node_keys:
        values["node-keys"] = node_keys
    if git is not None:
        values["git-commit"] = git["commit"] + ("+dirty" if git["dirty"] else "")
    for key, value in values.items():
        if '"' in value:
            raise DeployError(f"{key} {value!r}: double quotes cannot pass through flwr's --run-config")
    return " ".join(f'{key}="{value}"' for key, value in values.items())


def fab_paths(app_dir: Path) -> list[str]:
    """List the files ``flwr run APP_DIR`` puts into the app's FAB (Flower's own selection:
    ``.gitignore``, ``fab-include`` / ``fab-exclude`` and its built-in patterns).

    Raises :class:`DeployError` for a file the FAB cannot carry: Flower 1.41 lists the
    files in a comma-separated manifest, so a path with a comma (a ``fedflex sweep``
    results folder such as ``method=hics,seed=0``) breaks the ServerApp when it unpacks
    the FAB, after the run has been submitted.
    """
    import tomli  # Flower's own TOML reader (tomllib is Python 3.11+)
    from flwr.cli.build import collect_files, get_filtered_fab_paths

    app_dir = Path(app_dir).resolve()
    try:
        config = tomli.loads((app_dir / "pyproject.toml").read_text())
        files: dict[str, bytes | Path] = dict(collect_files(app_dir))
        paths = sorted(get_filtered_fab_paths(files, config))
    except (OSError, ValueError) as exc:
        raise DeployError(f"cannot build the app in {app_dir}: {exc}") from None
    bad = [path for path in paths if "," in path]
    if bad:
        shown = "\n  ".join(bad[:5]) + (f"\n  ... and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise DeployError(
            f"{len(bad)} file(s) of the app in {app_dir} have a comma in their path, which Flower's "
            f"FAB cannot carry:\n  {shown}\nmove them out of the app folder, or leave them out of the "
            "FAB with `fab-exclude` (or list what it needs with `fab-include`) under [tool.flwr.app] "
            "in pyproject.toml"
        )
    return paths


def _flower_env(home: Path, extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """Environment of a Flower process: its own FLWR_HOME, the interpreter's bin on PATH
    (the SuperLink and SuperNodes start ``flower-superexec`` by name), no runtime
    dependency installation, no telemetry or update checks (no network needed).
    """
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["FLWR_HOME"] = str(home)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.5")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["TERM"] = "dumb"
    env["NO_COLOR"] = "1"
    if extra:
        env.update(extra)
    return env


def flwr_config_toml(address: str, ca_cert: Optional[Path] = None, name: str = CONNECTION) -> str:
    """Return a ``$FLWR_HOME/config.toml`` whose default SuperLink connection is ``address``."""
    lines = ["[superlink]", f'default = "{name}"', "", f"[superlink.{name}]", f'address = "{address}"']
    if ca_cert is None:
        lines.append("insecure = true")
    else:
        lines.append(f'root-certificates = "{Path(ca_cert).resolve()}"')
    return "\n".join(lines) + "\n"


def superlink_command(
    port: int,
    host: str = LOOPBACK,
    tls: Optional[TlsFiles] = None,
    auth: bool = False,
    executable: Optional[str] = None,
    database: Optional[Path] = None,
) -> list[str]:
    """``flower-superlink`` arguments (one HTTP(S) port serves the Fleet, Control and
    Runtime APIs in Flower 1.41). ``database``: an SQLite file for the SuperLink's state
    (registered SuperNode keys, nodes, runs), so that a restarted SuperLink knows its
    SuperNodes again; None keeps the state in memory (lost on a restart: with node
    authentication every SuperNode is then refused with 401 and exits).
    """
    cmd = [executable or find_executable("flower-superlink"), "--host", host, "--port", str(port)]
    if tls is None:
        cmd.append("--insecure")
    else:
        cmd += [
            "--ssl-ca-certfile",
            str(tls.ca_cert),
            "--ssl-certfile",
            str(tls.server_cert),
            "--ssl-keyfile",
            str(tls.server_key),
        ]
    if auth:
        cmd.append("--enable-supernode-auth")
    if database is not None:
        cmd += ["--database", str(database)]
    cmd.append("--disable-runtime-dependency-installation")
    return cmd


def supernode_command(
    superlink: str,
    partition_id: int,
    num_partitions: int,
    runtime_port: int,
    *,
    ca_cert: Optional[Path] = None,
    auth_key: Optional[Path] = None,
    data_path: Optional[str] = None,
    max_wait_time: Optional[float] = None,
    prefix: Optional[Sequence[str]] = None,
) -> list[str]:
    """``flower-supernode`` arguments. ``runtime_port``: the SuperNode's own Runtime API
    (its ClientApp processes talk to it), distinct per SuperNode on one machine.
    ``prefix``: another command that takes flower-supernode's arguments.
    """
    cmd = list(prefix) if prefix else [find_executable("flower-supernode")]
    cmd += ["--superlink", superlink, "--host", LOOPBACK, "--port", str(runtime_port)]
    cmd += ["--insecure"] if ca_cert is None else ["--root-certificates", str(ca_cert)]
    if auth_key is not None:
        cmd += ["--auth-supernode-private-key", str(auth_key)]
    if max_wait_time is not None:
        cmd += ["--max-wait-time", str(max_wait_time)]
    cmd += ["--node-config", node_config(partition_id, num_partitions, data_path)]
    return cmd


@dataclass
class RunResult:
    """How a ``flwr run`` on a local federation ended."""

    run_id: int
    status: str
    out: Optional[Path]
    wall_s: float
    log_path: Path
    details: str = ""

    @property
    def ok(self) -> bool:
        """Return True when the run finished and completed."""
        return self.status == "finished:completed"


@dataclass
class LocalFederation:
    """A SuperLink and SuperNodes as local processes on the loopback interface.

    Parameters
    ----------
    workdir
        Holds ``logs/``, one ``FLWR_HOME`` per process under ``homes/``, the SuperLink's
        state (``state/superlink.db``) and, with ``tls``/``auth`` made here, ``certs/``.
    num_nodes
        N SuperNodes, partition ids 0..N-1, ``num-partitions=N``.
    app_dir
        The Flower app ``flwr run`` builds (fedflex's checkout: pyproject.toml with
        ``[tool.flwr.app]``).
    tls
        Certificates for HTTPS between SuperNodes / CLI and SuperLink (None: insecure HTTP).
    auth
        SuperNode authentication: keys in ``keys_dir`` (``supernode-i`` /
        ``supernode-i.pub``) are registered before the SuperNodes start.
    keys_dir
        Where the SuperNode key pairs are (default ``workdir/certs/keys``).
    bind_keys
        With ``auth``: write ``workdir/node-keys.json`` (partition id i -> the
        fingerprint of ``supernode-i.pub``) and give it to every run, so that a node
        serves a partition id only with that id's key (:mod:`fedflex.node_keys`).
    superlink_port
        None: a free port.
    data_path
        Passed to every SuperNode as ``data-path`` in its node config.
    supernode_prefix
        Command that replaces ``flower-supernode`` (it gets the same arguments).
    env
        Extra environment for every process.
    node_env
        Extra environment of single SuperNodes, by partition id.
    persistent
        The SuperLink keeps its state in ``workdir/state/superlink.db`` (default): a
        SuperLink restarted on it lets its SuperNodes, registered keys and all, back in.
        False: in memory, as Flower does without ``--database``.
    grace
        Seconds between SIGTERM and SIGKILL when stopping.
    start_timeout
        Seconds each component may take to come up.
    """

    workdir: Path
    num_nodes: int
    app_dir: Path = REPO_ROOT
    tls: Optional[TlsFiles] = None
    auth: bool = False
    keys_dir: Optional[Path] = None
    bind_keys: bool = True
    superlink_port: Optional[int] = None
    data_path: Optional[str] = None
    supernode_prefix: Optional[Sequence[str]] = None
    env: dict[str, str] = field(default_factory=dict)
    persistent: bool = True
    node_env: dict[int, dict[str, str]] = field(default_factory=dict)
    grace: float = 5.0
    start_timeout: float = 90.0
    cli_timeout: float = 60.0
    superlink: Optional[ManagedProcess] = field(default=None, init=False)
    nodes: dict[int, ManagedProcess] = field(default_factory=dict, init=False)
    runtime_ports: dict[int, int] = field(default_factory=dict, init=False)
    extra: list[ManagedProcess] = field(default_factory=list, init=False)
    registered: set[str] = field(default_factory=set, init=False)
    node_keys: Optional[Path] = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        self.app_dir = Path(self.app_dir).resolve()
        if self.num_nodes < 1:
            raise DeployError(f"--nodes must be >= 1, got {self.num_nodes}")
        if self.auth and self.tls is None:
            raise DeployError("SuperNode authentication needs TLS (Flower refuses it over plain HTTP)")
        if not (self.app_dir / "pyproject.toml").is_file():
            raise DeployError(
                f"{self.app_dir} has no pyproject.toml: `flwr run` needs fedflex's source checkout "
                "(an editable install, pip install -e .)"
            )
        self.logs = self.workdir / "logs"
        self.homes = self.workdir / "homes"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.database = (self.workdir / "state" / "superlink.db") if self.persistent else None
        if self.database is not None:
            self.database.parent.mkdir(parents=True, exist_ok=True)
        if self.keys_dir is None:
            self.keys_dir = self.workdir / "certs" / "keys"
        if self.superlink_port is None:
            self.superlink_port = free_port()
        else:
            check_port_free(self.superlink_port, what="SuperLink port")
        self.address = f"{LOOPBACK}:{self.superlink_port}"
        cli_home = self._home("cli")
        (cli_home / "config.toml").write_text(flwr_config_toml(self.address, self.tls.ca_cert if self.tls else None))

    # ---------------------------------------------------------------- context manager
    def __enter__(self) -> "LocalFederation":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _home(self, name: str) -> Path:
        home = self.homes / name
        home.mkdir(parents=True, exist_ok=True)
        return home

    def _env(self, home: str, extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
        return _flower_env(self._home(home), {**self.env, **(extra or {})})

    def key_path(self, partition_id: int) -> Path:
        """Return the path of SuperNode ``partition_id``'s private key."""
        assert self.keys_dir is not None
        return self.keys_dir / f"supernode-{partition_id}"

    # ---------------------------------------------------------------- start
    def start(self) -> "LocalFederation":
        """SuperLink, key registration (``auth``), then all SuperNodes; wait for each."""
        self.start_superlink()
        if self.auth:
            for i in range(self.num_nodes):
                self.register_key(self.key_path(i).with_suffix(".pub"), name=f"supernode-{i}")
            if self.bind_keys:
                self.write_key_binding()
        for i in range(self.num_nodes):
            self.start_supernode(i, wait=False)
        for i in range(self.num_nodes):
            self.wait_supernode(i)
        self.watch()
        return self

    def watch(self) -> None:
        """Remember what the SuperLink and the SuperNodes have started so far (their
        SuperExecs, the ServerApp and ClientApps): a process whose parent is killed from
        outside is re-parented to init, and only what was remembered is stopped with the
        rest. :meth:`wait_run` calls it twice a second.
        """
        remember_families([p for p in (self.superlink, *self.nodes.values()) if p is not None])

    def start_superlink(self) -> ManagedProcess:
        """Start the SuperLink on its port (refused when the port is in use) and return its process."""
        assert self.superlink_port is not None
        check_port_free(self.superlink_port, what="SuperLink port")
        cmd = superlink_command(self.superlink_port, tls=self.tls, auth=self.auth, database=self.database)
        proc = self.superlink = ManagedProcess(
            "superlink", cmd, self._env("superlink"), self.logs / "superlink.log", cwd=self.workdir
        )
        if not wait_until(lambda: not proc.alive() or port_open(self.superlink_port), self.start_timeout):
            raise DeployError(
                f"the SuperLink did not open port {self.superlink_port} within {self.start_timeout:.0f} s:\n"
                f"{proc.tail()}"
            )
        if not proc.alive():
            raise DeployError(f"the SuperLink exited with status {proc.returncode}:\n{proc.tail()}")
        logger.info("SuperLink listening on %s (%s)", self.address, "TLS" if self.tls else "insecure")
        return proc

    def write_key_binding(self) -> Path:
        """``workdir/node-keys.json``: partition id i -> fingerprint of ``supernode-i.pub``."""
        try:
            self.node_keys = write_binding(
                self.workdir / "node-keys.json",
                {i: self.key_path(i).with_suffix(".pub") for i in range(self.num_nodes)},
            )
        except KeyBindingError as exc:
            raise DeployError(str(exc)) from None
        return self.node_keys

    def register_key(self, public_key: Path, name: Optional[str] = None) -> None:
        """``flwr supernode register``: let the SuperNode holding this key's private half in."""
        if not public_key.is_file():
            raise DeployError(f"public key {public_key} not found")
        args = ["supernode", "register", str(public_key), CONNECTION]
        if name:
            args += ["--name", name]
        done = self.flwr(*args)
        if done.returncode != 0:
            raise DeployError(f"flwr supernode register {public_key} failed: {_last_lines(done)}")
        self.registered.add(str(public_key))
        logger.info("registered %s", public_key)

    def start_supernode(
        self,
        partition_id: int,
        *,
        wait: bool = True,
        auth_key: Optional[Path] = None,
        max_wait_time: Optional[float] = None,
    ) -> ManagedProcess:
        """Start (or restart) the SuperNode of ``partition_id``; it keeps its Runtime API
        port across restarts. ``auth_key``: another private key than its own.
        """
        old = self.nodes.get(partition_id)
        if old is not None and old.alive():
            raise DeployError(f"supernode-{partition_id} is already running (pid {old.pid})")
        port = self.runtime_ports.get(partition_id)
        if port is None or not bindable(port):
            port = self.runtime_ports[partition_id] = free_port()
        if self.auth and auth_key is None:
            auth_key = self.key_path(partition_id)
        cmd = supernode_command(
            self.address,
            partition_id,
            self.num_nodes,
            port,
            ca_cert=self.tls.ca_cert if self.tls else None,
            auth_key=auth_key,
            data_path=self.data_path,
            max_wait_time=max_wait_time,
            prefix=self.supernode_prefix,
        )
        name = f"supernode-{partition_id}"
        env = self._env(name, self.node_env.get(partition_id))
        proc = self.nodes[partition_id] = ManagedProcess(name, cmd, env, self.logs / f"{name}.log", cwd=self.workdir)
        if wait:
            self.wait_supernode(partition_id)
        return proc

    def wait_supernode(self, partition_id: int, timeout: Optional[float] = None) -> None:
        """Until the SuperNode says the SuperLink accepted it; DeployError if it exits."""
        proc = self.nodes[partition_id]
        timeout = self.start_timeout if timeout is None else timeout
        if not wait_until(lambda: not proc.alive() or SUPERNODE_READY in proc.output(), timeout):
            assert self.superlink_port is not None
            why = transport_mismatch(link_transport(self.superlink_port), "--insecure" not in proc.cmd, self.address)
            raise DeployError(
                f"{proc.name} did not connect within {timeout:.0f} s"
                + (f": {why}" if why else "")
                + f":\n{proc.tail()}"
            )
        if SUPERNODE_READY not in proc.output():
            raise DeployError(f"{proc.name} exited with status {proc.returncode}:\n{proc.tail()}")
        logger.info("%s connected", proc.name)

    def start_extra(self, name: str, cmd: Sequence[str], home: Optional[str] = None) -> ManagedProcess:
        """Any further process (e.g. a SuperNode with a foreign key) stopped with the rest;
        ``home``: whose FLWR_HOME it uses (default: its own).
        """
        proc = ManagedProcess(name, cmd, self._env(home or name), self.logs / f"{name}.log", cwd=self.workdir)
        self.extra.append(proc)
        return proc

    # ---------------------------------------------------------------- faults
    def kill_superlink(self) -> None:
        """SIGKILL the SuperLink and everything it started (its SuperExec, the ServerApp
        of the run in flight): a crashed coordinating machine.
        """
        if self.superlink is not None:
            self.superlink.kill()
            logger.info("killed the SuperLink")

    def restart_superlink(self) -> ManagedProcess:
        """Start the SuperLink again on the same port (and state file, when persistent);
        the SuperNodes, which retry, reconnect by themselves.
        """
        if self.superlink is not None and self.superlink.alive():
            raise DeployError(f"the SuperLink is still running (pid {self.superlink.pid})")
        if self.superlink is not None:
            self.extra.append(self.superlink)  # its leftovers are still checked and stopped
        assert self.superlink_port is not None
        if not wait_until(lambda: bindable(self.superlink_port), 30.0):
            raise DeployError(f"port {self.superlink_port} still held 30 s after the SuperLink stopped")
        return self.start_superlink()

    def kill_supernode(self, partition_id: int) -> None:
        """SIGKILL a SuperNode and everything it started (a crashed machine)."""
        self.nodes[partition_id].kill()
        logger.info("killed supernode-%d", partition_id)

    # ---------------------------------------------------------------- flwr CLI
    def flwr(self, *args: str, timeout: Optional[float] = None) -> subprocess.CompletedProcess:
        """Run the ``flwr`` CLI against this federation (its own FLWR_HOME)."""
        cmd = [find_executable("flwr"), *args]
        try:
            return subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                env=self._env("cli"),
                cwd=str(self.app_dir),
                timeout=timeout or self.cli_timeout,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise DeployError(f"{shlex.join(cmd)} did not finish within {timeout or self.cli_timeout:.0f} s") from None

    def submit(
        self, scenario: str, overrides: Sequence[str] = (), out: Optional[Path] = None, resume: Optional[Path] = None
    ) -> int:
        """``flwr run`` the scenario (or, with ``resume``, continue the run whose results are
        there from its checkpoint); returns the run id (the run goes on in the SuperLink).
        """
        keys = str(self.node_keys) if self.node_keys else ""
        git = git_commit(self.app_dir)
        if resume is not None:
            config = run_config("", resume=str(Path(resume).resolve()), node_keys=keys, git=git)
        else:
            config = run_config(
                str(Path(scenario).resolve()),
                overrides,
                str(Path(out).resolve()) if out else "",
                node_keys=keys,
                git=git,
            )
        fab_paths(self.app_dir)  # a file the FAB cannot carry fails here, not in the SuperLink
        done = self.flwr("run", str(self.app_dir), CONNECTION, "--format", "json", "--run-config", config)
        payload = _json_from(done.stdout)
        if done.returncode != 0 or not payload or not payload.get("success"):
            raise DeployError(f"flwr run failed ({done.returncode}): {_last_lines(done)}")
        run_id = int(payload["run-id"])
        logger.info("run %d started", run_id)
        return run_id

    def run_status(self, run_id: int) -> tuple[str, str]:
        """(status, details) of a run, e.g. ("finished:completed", "N/A")."""
        done = self.flwr("ls", CONNECTION, "--run-id", str(run_id), "--format", "json")
        payload = _json_from(done.stdout)
        if done.returncode != 0 or not payload or not payload.get("runs"):
            raise DeployError(f"flwr ls --run-id {run_id} failed: {_last_lines(done)}")
        run = payload["runs"][0]
        return str(run.get("status", "")), str(run.get("status-details", ""))

    def stop_run(self, run_id: int) -> None:
        """``flwr stop`` (best effort)."""
        try:
            done = self.flwr("stop", str(run_id), CONNECTION, timeout=30)
            if done.returncode != 0:
                logger.warning("flwr stop %d: %s", run_id, _last_lines(done))
        except DeployError as exc:
            logger.warning("%s", exc)

    def follow_run(self, run_id: int) -> ManagedProcess:
        """``flwr log RUN_ID --stream`` into ``logs/run-<id>.log`` (ends with the run)."""
        return self.start_extra(
            f"run-{run_id}", [find_executable("flwr"), "log", str(run_id), CONNECTION, "--stream"], home="cli"
        )

    def wait_run(self, run_id: int, timeout: float, out: Optional[Path] = None, on_line=None) -> RunResult:
        """Stream the run's logs to ``logs/run-<id>.log`` until it finishes or ``timeout``
        seconds pass (then ``flwr stop``; status ``timeout``).
        """
        t0 = time.monotonic()
        log_path = self.logs / f"run-{run_id}.log"
        stream = self.follow_run(run_id)
        printer = _Follower(log_path, on_line) if on_line else None
        status, details = "running", ""
        next_check = t0 + 30.0
        quick_checks = 0  # status checks since the log stream ended / results appeared
        summary = (Path(out) / SUMMARY_FILE) if out else None
        try:
            while True:
                now = time.monotonic()
                ended = not stream.alive() or (summary is not None and summary.exists())
                if ended or now >= next_check:
                    try:
                        status, details = self.run_status(run_id)
                    except DeployError as exc:  # a busy SuperLink: ask again later
                        logger.warning("%s", exc)
                    if status.startswith("finished"):
                        break
                    quick_checks = quick_checks + 1 if ended else 0
                    next_check = now + (2.0 if 0 < quick_checks <= 5 else 30.0)
                if now - t0 > timeout:
                    logger.warning("run %d did not finish within %.0f s: stopping it", run_id, timeout)
                    self.stop_run(run_id)
                    status, details = "timeout", f"no end within {timeout:.0f} s"
                    break
                if self.superlink is not None and not self.superlink.alive():
                    status, details = "superlink-exited", self.superlink.tail()
                    break
                self.watch()
                if printer:
                    printer.poll()
                time.sleep(0.5)
            wait_until(lambda: not stream.alive(), 5.0)
        finally:
            stream.stop(self.grace)
            if printer:
                printer.poll()
        return RunResult(run_id, status, Path(out) if out else None, time.monotonic() - t0, log_path, details)

    def run(
        self,
        scenario: str,
        overrides: Sequence[str] = (),
        out: Optional[Path] = None,
        timeout: float = 7200.0,
        on_line=None,
        resume: Optional[Path] = None,
    ) -> RunResult:
        """Submit the scenario (or ``resume`` a run, ``out`` then being its directory) and
        wait for its end; a run still going on when this returns by an exception (Ctrl-C
        included) is stopped with ``flwr stop``.
        """
        run_id = self.submit(scenario, overrides, out, resume=resume)
        finished = False
        try:
            result = self.wait_run(run_id, timeout, out, on_line)
            finished = result.status.startswith("finished") or result.status == "timeout"
            return result
        finally:
            if not finished and self.superlink is not None and self.superlink.alive():
                self.stop_run(run_id)

    # ---------------------------------------------------------------- stop
    def processes(self) -> list[ManagedProcess]:
        """Return every process the federation started (extras, SuperNodes, SuperLink)."""
        return [*self.extra, *self.nodes.values(), *([self.superlink] if self.superlink else [])]

    def stop(self) -> None:
        """Stop everything: extra processes and SuperNodes first, the SuperLink last."""
        stop_all([*self.extra, *self.nodes.values()], self.grace)
        if self.superlink is not None:
            self.superlink.stop(self.grace)

    def leftovers(self) -> list[int]:
        """Pids of processes this federation started that still run (should be [])."""
        pids = []
        for proc in self.processes():
            if proc.alive():
                pids.append(proc.pid)
            pids += proc.leftovers()
        return pids


class _Follower:
    """Hand new complete lines of a growing file to a callback."""

    def __init__(self, path: Path, callback) -> None:
        self.path, self.callback, self.offset, self.buffer = path, callback, 0, ""

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        self.buffer += data.decode(errors="replace")
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            self.callback(line)


def _json_from(text: str) -> Optional[dict]:
    """Return the first JSON object in ``text`` (flwr may print other lines around it)."""
    start = text.find("{")
    while start != -1:
        try:
            obj, _ = json.JSONDecoder().raw_decode(text[start:])
            if isinstance(obj, dict):
                return obj
        except json.JSONDecodeError:
            pass
        start = text.find("{", start + 1)
    return None


def _last_lines(done: subprocess.CompletedProcess, n: int = 8) -> str:
    text = "\n".join(x for x in (done.stdout or "", done.stderr or "") if x.strip())
    return "\n".join(text.strip().splitlines()[-n:]) or f"exit status {done.returncode}"
