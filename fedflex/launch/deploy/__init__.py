"""Real Flower federations of local processes: ``fedflex deploy local``.

Starts a SuperLink and N SuperNodes (Flower 1.41's Deployment Engine) as separate
processes on the loopback interface, launches a scenario on them with ``flwr run``, waits
for the run to end and stops every process it started. It is the same topology as
``docker/docker-compose.yml`` (one SuperLink, SuperNodes with
``--node-config "partition-id=i num-partitions=N"``), without Docker, and the same
commands a two-machine deployment uses (see ``docs/deployment.md``).

Processes
---------
Every component runs in its own session / process group, with stdout and stderr in
``WORKDIR/logs/<name>.log``. Stopping one sends SIGTERM to its process group and to the
groups of all its descendants (Flower's SuperLink starts its SuperExec detached, in a
session of its own), waits a grace period, then sends SIGKILL to whatever is left. A
:class:`LocalFederation` is a context manager: processes are stopped on normal exit, on
errors and on Ctrl-C.

Security
--------
``tls``: the SuperLink serves HTTPS with a certificate signed by a CA that SuperNodes and
the ``flwr`` CLI trust (``scripts/make_certs.sh``). ``auth``: the SuperLink runs with
``--enable-supernode-auth``; each SuperNode's EC public key is registered with
``flwr supernode register`` before the SuperNode starts with
``--auth-supernode-private-key``; a SuperNode whose key is not registered is refused.

Layers: :mod:`.processes` (process supervision), :mod:`.certs` (certificates and keys),
:mod:`.federation` (a SuperLink and SuperNodes, and a run on them), :mod:`.command` (the
command line).
"""

from fedflex.launch.deploy.certs import TlsFiles, make_certificates
from fedflex.launch.deploy.command import add_arguments, add_check_arguments, deploy_check, deploy_local
from fedflex.launch.deploy.federation import (
    LocalFederation,
    RunResult,
    flwr_config_toml,
    node_config,
    run_config,
    superlink_command,
    supernode_command,
)
from fedflex.launch.deploy.processes import (
    DeployError,
    ManagedProcess,
    check_port_free,
    find_executable,
    free_port,
    link_transport,
    port_open,
    stop_all,
    wait_until,
)

__all__ = [
    "DeployError",
    "LocalFederation",
    "ManagedProcess",
    "RunResult",
    "TlsFiles",
    "add_arguments",
    "add_check_arguments",
    "deploy_check",
    "check_port_free",
    "deploy_local",
    "find_executable",
    "flwr_config_toml",
    "free_port",
    "link_transport",
    "make_certificates",
    "node_config",
    "port_open",
    "run_config",
    "stop_all",
    "superlink_command",
    "supernode_command",
    "wait_until",
]
