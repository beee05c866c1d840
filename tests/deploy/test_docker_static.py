"""docker/: static checks (no Docker engine runs on these machines).

The compose files must describe the topology ``fedflex deploy local`` runs and the
loopback tests exercise: their commands are compared with the command lines
:mod:`fedflex.launch.deploy` builds and parsed with Flower 1.41's own argument parsers; the
Dockerfile must copy only what exists and pin the flwr of constraints.txt (the tested set); the
TLS variant must mount exactly the files scripts/make_certs.sh writes.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib
import yaml
from flwr.common.config import parse_config_args
from packaging.requirements import Requirement
from packaging.version import Version

from fedflex.launch.deploy import TlsFiles, node_config, superlink_command, supernode_command

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
COMPOSE = {"plain": DOCKER / "docker-compose.yml", "tls": DOCKER / "docker-compose.tls.yml"}
NUM_NODES = 3
PORT = 8000
RUNTIME_PORT = 9094
IN_CERTS = Path("/app/certs")
STATE = Path("/app/state/superlink.db")  # in the named volume superlink-state
CERTS_VAR = re.compile(r"\$\{FEDFLEX_CERTS[^}]*\}")


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _compose(kind: str) -> dict:
    return yaml.safe_load(COMPOSE[kind].read_text())


def _flwr_pin() -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return next(Requirement(d) for d in project["dependencies"] if Requirement(d).name == "flwr")


# ------------------------------------------------------------------------------ Dockerfile
def test_every_copy_source_exists_in_the_build_context():
    for word, args in _instructions(DOCKERFILE):
        if word not in ("COPY", "ADD"):
            continue
        if args.startswith("--from=requirements "):
            continue  # from the stage that reads pyproject's requirements, not the context
        parts = [p for p in shlex.split(args) if not p.startswith("--")]
        assert "--from" not in args, "no other multi-stage COPY --from expected"
        for source in parts[:-1]:
            assert (ROOT / source).exists(), f"{word} {source}: not in the repository"


def test_copied_sources_are_not_docker_ignored():
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for word, args in _instructions(DOCKERFILE):
        if word in ("COPY", "ADD"):
            for source in shlex.split(args)[:-1]:
                assert source.rstrip("/") not in ignored, f"{source} is copied but .dockerignored"


def test_ignore_file_is_where_both_builders_read_it():
    # the legacy builder reads only <context>/.dockerignore; BuildKit prefers a
    # <Dockerfile>.dockerignore, which would then hide the root one from it
    assert (ROOT / ".dockerignore").is_file()
    assert not (DOCKER / "Dockerfile.dockerignore").exists()
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", "runs", "certs", "**/*.key"} <= set(ignored)


def test_dockerfile_pins_the_flwr_version_of_pyproject():
    args = dict(a.split("=", 1) for w, a in _instructions(DOCKERFILE) if w == "ARG" and "=" in a)
    pinned = Version(args["FLWR_VERSION"])
    assert pinned in _flwr_pin().specifier, f"FLWR_VERSION {pinned} outside pyproject's {_flwr_pin()}"
    pins = (ROOT / "constraints.txt").read_text().split()
    tested = Version(next(p.removeprefix("flwr==") for p in pins if p.startswith("flwr==")))
    assert pinned == tested, f"images would run flwr {pinned}, constraints.txt (the tested set) holds {tested}"
    installs = [a for w, a in _instructions(DOCKERFILE) if w == "RUN" and "flwr" in a]
    assert any('"flwr[simulation]==${FLWR_VERSION}"' in a for a in installs)


def test_dockerfile_has_a_target_per_component():
    stages: dict[str, list[str]] = {}
    current = None
    for word, args in _instructions(DOCKERFILE):
        if word == "FROM":
            current = args.split(" AS ")[-1].strip() if " AS " in args else None
            stages[current] = []
        elif word == "ENTRYPOINT":
            stages[current] = yaml.safe_load(args)
    assert stages["superlink"] == ["fedflex-entrypoint", "flower-superlink"]
    assert stages["supernode"] == ["fedflex-entrypoint", "flower-supernode"]
    assert stages["superexec"] == ["fedflex-entrypoint", "flower-superexec"]


def test_default_image_gets_cpu_torch_and_checks_it():
    args = dict(a.split("=", 1) for w, a in _instructions(DOCKERFILE) if w == "ARG" and "=" in a)
    assert args["TORCH_VARIANT"] == "cpu" and args["TORCH_INDEX_URL"].endswith("/whl/cpu")
    runs = [a for w, a in _instructions(DOCKERFILE) if w == "RUN"]
    installs = [i for i, a in enumerate(runs) if "pip install" in a]
    pins = [i for i, a in enumerate(runs) if "> /etc/torch-constraints.txt" in a]
    constrained = [i for i, a in enumerate(runs) if "-c /etc/torch-constraints.txt" in a]
    checked = [i for i, a in enumerate(runs) if "torch.version.cuda is None" in a]
    assert pins == installs[:1]  # the first install pins torch
    assert constrained == installs[1:-1]  # the dependencies resolve against that pin
    assert "--no-deps" in runs[installs[-1]] and checked == installs[-1:]  # fedflex alone, then the check


def test_build_arguments_hold_no_changing_values():
    # every ARG is part of the cache key of the layers after it: a value that changes from one
    # build to the next (a random port, a date) would rebuild the pip layers every time
    args = {a.split("=", 1)[0] for w, a in _instructions(DOCKERFILE) if w == "ARG"}
    assert args == {"BASE_IMAGE", "FLWR_VERSION", "TORCH_INDEX_URL", "TORCH_VARIANT", "PIP_EXTRA_ARGS", "UID"}
    for kind in COMPOSE:
        build = _compose(kind)["services"]["superlink"]["build"]
        assert build["args"] == {
            "BASE_IMAGE": "${FEDFLEX_BASE_IMAGE:-python:3.11-slim}",
            "PIP_EXTRA_ARGS": "${FEDFLEX_PIP_EXTRA_ARGS:-}",
        }
        assert build["network"] == "${FEDFLEX_BUILD_NETWORK:-default}"
    script = (ROOT / "scripts" / "docker_e2e.sh").read_text()
    assert "getsockname" not in script and "$RANDOM" not in script  # no random wheel-server port
    assert 'FEDFLEX_PIP_EXTRA_ARGS="--no-index --find-links http://127.0.0.1:$wport/"' in script


def test_dependencies_are_installed_before_the_code_is_copied():
    # a change of fedflex's code reinstalls fedflex only, not torch or flwr
    steps = [(w, a) for w, a in _instructions(DOCKERFILE)]
    first_code = next(i for i, (w, a) in enumerate(steps) if w == "COPY" and a.startswith("fedflex "))
    deps = next(i for i, (w, a) in enumerate(steps) if w == "RUN" and "-r /etc/fedflex-requirements.txt" in a)
    assert deps < first_code
    assert any(w == "RUN" and "pip install ${PIP_EXTRA_ARGS} --no-deps ." in a for w, a in steps[first_code:])


# ------------------------------------------------------------------------------ entrypoint
ENTRYPOINT = DOCKER / "entrypoint.sh"


def _as_root_only():
    import os

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (as in the image)")


@pytest.mark.parametrize("uid", [1000, 4242])
def test_entrypoint_runs_the_command_as_the_owner_of_the_mounted_files(tmp_path, uid):
    _as_root_only()
    import os

    # Prepare: a results directory owned by some user
    runs = tmp_path / "runs"
    runs.mkdir()
    os.chown(runs, uid, uid + 1)
    env = {"PATH": "/usr/bin:/bin", "FEDFLEX_RUN_AS_OWNER_OF": str(runs)}
    # Execute
    done = subprocess.run(
        ["sh", str(ENTRYPOINT), "sh", "-c", 'echo "$(id -u):$(id -g) $FLWR_HOME"; touch "$FLWR_HOME/x"'],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    # Assert: that uid and gid, with a FLWR_HOME it can write
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"{uid}:{uid + 1}", f"/tmp/home-{uid}/.flwr"]


def test_entrypoint_keeps_root_for_root_owned_files(tmp_path):
    _as_root_only()
    (tmp_path / "runs").mkdir()
    env = {"PATH": "/usr/bin:/bin", "FEDFLEX_RUN_AS_OWNER_OF": str(tmp_path / "runs")}
    done = subprocess.run(["sh", str(ENTRYPOINT), "id", "-u"], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "0"


# ------------------------------------------------------------------------------ compose
@pytest.mark.parametrize("kind", ["plain", "tls"])
def test_compose_has_a_superlink_and_three_supernodes(kind):
    services = _compose(kind)["services"]
    assert set(services) == {"superlink", *(f"supernode-{i}" for i in range(NUM_NODES))}
    for name, service in services.items():
        build = service["build"]
        assert (COMPOSE[kind].parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
        assert build["target"] == ("superlink" if name == "superlink" else "supernode")
    assert services["superlink"]["ports"] == [f"127.0.0.1:${{FEDFLEX_PORT:-{PORT}}}:{PORT}"]  # loopback only


@pytest.mark.parametrize("kind", ["plain", "tls"])
def test_compose_commands_are_what_deploy_local_runs(kind):
    # Prepare: the command lines fedflex.launch.deploy builds for the same topology
    tls = kind == "tls"
    files = TlsFiles(IN_CERTS / "ca.crt", IN_CERTS / "server.crt", IN_CERTS / "server.key") if tls else None
    services = _compose(kind)["services"]
    # Assert
    expected = superlink_command(
        PORT, host="0.0.0.0", tls=files, auth=tls, executable="flower-superlink", database=STATE
    )
    assert services["superlink"]["command"] == expected[1:]
    for i in range(NUM_NODES):
        expected = supernode_command(
            f"superlink:{PORT}",
            i,
            NUM_NODES,
            RUNTIME_PORT,
            ca_cert=files.ca_cert if files else None,
            auth_key=IN_CERTS / "keys" / f"supernode-{i}" if tls else None,
            prefix=["flower-supernode"],
        )
        assert services[f"supernode-{i}"]["command"] == expected[1:], f"supernode-{i}"


@pytest.mark.parametrize("kind", ["plain", "tls"])
def test_compose_commands_parse_with_flowers_own_parsers(kind):
    from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    services = _compose(kind)["services"]
    link = _parse_args_run_superlink().parse_args(services["superlink"]["command"])
    assert link.port == PORT and link.host == "0.0.0.0"
    assert link.insecure is (kind == "plain")
    assert link.enable_supernode_auth is (kind == "tls")
    assert link.runtime_dependency_install is False
    assert link.database == str(STATE)
    for i in range(NUM_NODES):
        node = _parse_args_run_supernode().parse_args(services[f"supernode-{i}"]["command"])
        assert node.superlink == f"superlink:{link.port}"  # the service name and its port
        assert node.insecure is (kind == "plain")
        assert parse_config_args([node.node_config]) == {"partition-id": i, "num-partitions": NUM_NODES}
        assert node.node_config == node_config(i, NUM_NODES)


def test_tls_compose_mounts_what_make_certs_writes(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    # Prepare: the files make_certs.sh writes, in a stand-in for ./certs
    certs = tmp_path / "certs"
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "make_certs.sh"), "-o", str(certs), "-n", "3", "superlink"],
        check=True,
        capture_output=True,
    )
    # Assert: every mounted file exists there; every /app/certs path a command uses is mounted
    for name, service in _compose("tls")["services"].items():
        mounts = {}
        for volume in service.get("volumes", []):
            host, container, *_ = CERTS_VAR.sub("CERTS", volume).split(":")
            mounts[container] = host
        used = [arg for arg in service["command"] if arg.startswith(str(IN_CERTS))]
        assert used, name
        for path in used:
            assert path in mounts, f"{name} uses {path} but does not mount it"
            host = mounts[path]
            assert host.startswith("CERTS/"), f"{host}: certificates come from $FEDFLEX_CERTS, not the checkout"
            assert (certs / host.removeprefix("CERTS/")).is_file(), f"{name}: {host} is not written by make_certs.sh"
        if name != "superlink":  # a SuperNode sees its own key only
            keys = [c for c in mounts if "/keys/" in c]
            assert keys == [str(IN_CERTS / "keys" / f"{name}")], keys


@pytest.mark.parametrize("kind", ["plain", "tls"])
def test_scenarios_are_mounted_from_the_checkout(kind):
    volumes = [v.split("  ")[0] for v in _compose(kind)["services"]["superlink"]["volumes"]]
    assert "../scenarios:/app/scenarios:ro" in volumes
    assert (COMPOSE[kind].parent / "../scenarios").resolve() == ROOT / "scenarios"


def test_gpu_compose_builds_cuda_supernodes_and_reserves_gpus():
    gpu = yaml.safe_load((DOCKER / "docker-compose.gpu.yml").read_text())["services"]
    assert set(gpu) == {f"supernode-{i}" for i in range(NUM_NODES)}
    for service in gpu.values():
        assert service["build"]["args"]["TORCH_VARIANT"] == "cuda"
        assert service["image"].endswith("-cuda")
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]


@pytest.mark.parametrize("kind", ["plain", "tls"])
def test_superlink_state_is_in_a_named_volume(kind):
    compose = _compose(kind)
    volumes = compose["services"]["superlink"]["volumes"]
    assert f"superlink-state:{STATE.parent}" in [v.split("  ")[0] for v in volumes]
    assert "superlink-state" in compose["volumes"]


def test_make_certs_writes_outside_the_checkout_by_default(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "make_certs.sh"), "-n", "1"], check=True, capture_output=True, env=env, cwd=ROOT
    )
    written = tmp_path / ".config" / "fedflex" / "certs"
    assert (written / "ca.key").is_file() and (written / "keys" / "supernode-0").is_file()


def test_certificates_and_keys_in_the_checkout_are_git_ignored():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = ["certs/ca.key", "certs/keys/supernode-0", "docker/server.key"]
    done = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True, text=True)
    assert done.stdout.split() == paths


def test_server_certificate_names_the_compose_service(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    certs = tmp_path / "certs"
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "make_certs.sh"), "-o", str(certs), "-n", "0", "superlink"],
        check=True,
        capture_output=True,
    )
    text = subprocess.run(
        ["openssl", "x509", "-in", str(certs / "server.crt"), "-noout", "-ext", "subjectAltName"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "DNS:superlink" in text and "IP Address:127.0.0.1" in text and "DNS:localhost" in text


def test_image_scripts_are_executable():
    # COPY keeps the mode of the build context: the entry point is exec'd directly
    for name in ("entrypoint.sh", "pick-uid.sh", "install-compose-v2.sh"):
        assert os.access(DOCKER / name, os.X_OK), f"docker/{name} is not executable (chmod +x)"
    if shutil.which("git") and (ROOT / ".git").exists():
        listed = subprocess.run(
            ["git", "ls-files", "-s", "docker/"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout
        for line in listed.splitlines():  # tracked ones: executable in git too
            mode, *_, path = line.split()
            if path.endswith(".sh"):
                assert mode == "100755", f"{path}: git mode {mode}"
