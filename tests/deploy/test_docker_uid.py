"""docker/pick-uid.sh and docker/entrypoint.sh: the uid a container runs Flower as (no Docker).

The images start as root; the entrypoint drops to a user who can read the mounted keys and
write the mounted results folder. Here both scripts run on the host, as root, against
temporary folders owned by root, by uid 1000 (the image's user) and by another uid, laid
out as in the containers (``FEDFLEX_APP`` stands for ``/app``). Needs root and setpriv
(util-linux, as in the images); skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

DOCKER = Path(__file__).resolve().parents[2] / "docker"
PICK = DOCKER / "pick-uid.sh"
ENTRYPOINT = DOCKER / "entrypoint.sh"
OTHER = 4242  # a uid that is neither root nor the image's user
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}

pytestmark = pytest.mark.skipif(
    os.name != "posix" or os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv (as in the images)",
)


@pytest.fixture
def app():
    """An /app stand-in that every uid may enter (pytest's own tmp folders are root's, 700)."""
    base = Path(tempfile.mkdtemp(prefix="fedflex-uid-"))
    base.chmod(0o755)
    root = base / "app"
    (root / "certs" / "keys").mkdir(parents=True)
    for folder in (root, root / "certs", root / "certs" / "keys"):
        folder.chmod(0o755)
    image_runs = root / "runs"  # the image's own copy: root's, mode 1777
    image_runs.mkdir()
    image_runs.chmod(0o1777)
    yield root
    shutil.rmtree(base)


def _results(app: Path, uid: int, mode: int = 0o755) -> Path:
    """A results folder mounted over /app/runs, owned by ``uid``."""
    runs = app / "runs"
    os.chown(runs, uid, uid)
    runs.chmod(mode)
    return runs


def _key(app: Path, name: str, uid: int, mode: int = 0o600) -> Path:
    path = app / "certs" / name
    path.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    os.chown(path, uid, uid)
    path.chmod(mode)
    return path


def _pick(*args: str | Path) -> str:
    done = subprocess.run(["sh", str(PICK), *map(str, args)], env=ENV, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _entrypoint(app: Path, *command: str) -> subprocess.CompletedProcess:
    env = {**ENV, "FEDFLEX_APP": str(app)}
    return subprocess.run(["sh", str(ENTRYPOINT), *command], env=env, capture_output=True, text=True, check=False)


# ------------------------------------------------------------------------ pick-uid.sh
@pytest.mark.parametrize("uid", [1000, OTHER])
def test_keys_of_a_user_make_that_user(app, uid):
    key = _key(app, "keys/supernode-0", uid)
    assert _pick("-w", app / "runs", "-r", key) == f"{uid}:{uid}"


def test_a_root_owned_private_key_keeps_root(app):
    # the bug of issue 48: the image's /app/runs named uid 1000, who cannot read the key
    key = _key(app, "keys/supernode-0", 0)
    assert _pick("-w", app / "runs", "-r", key) == "0:0"


def test_a_root_owned_key_keeps_root_also_with_the_old_image_layout(app):
    # images built before: /app/runs belonged to uid 1000 (mode 755)
    _results(app, 1000)
    key = _key(app, "keys/supernode-0", 0)
    assert _pick("-w", app / "runs", "-r", key) == "0:0"


def test_a_root_owned_key_anybody_may_read_names_nobody(app):
    key = _key(app, "keys/supernode-0", 0, mode=0o644)
    assert _pick("-w", app / "runs", "-r", key) == "1000:1000"


@pytest.mark.parametrize("uid", [0, 1000, OTHER])
def test_the_results_folder_names_its_owner(app, uid):
    runs = _results(app, uid)
    assert _pick("-w", runs) == f"{uid}:{uid}"


def test_nothing_mounted_gives_the_images_user(app):
    assert _pick("-w", app / "runs") == "1000:1000"
    assert _pick() == "1000:1000"


@pytest.mark.parametrize("uid", [0, 1000, OTHER])
def test_superlink_with_results_and_server_key_of_one_user(app, uid):
    runs = _results(app, uid)
    key = _key(app, "server.key", uid)
    cert = _key(app, "server.crt", uid, mode=0o644)
    assert _pick("-w", runs, "-r", key, "-r", cert) == f"{uid}:{uid}"


def test_results_and_key_of_two_users_need_root(app):
    runs = _results(app, OTHER)
    key = _key(app, "server.key", 1000)
    assert _pick("-w", runs, "-r", key) == "0:0"


def test_a_results_folder_anybody_may_write_lets_the_key_owner_in(app):
    runs = _results(app, 0, mode=0o1777)
    key = _key(app, "server.key", OTHER)
    assert _pick("-w", runs, "-r", key) == f"{OTHER}:{OTHER}"


def test_the_group_comes_from_the_file(app):
    key = _key(app, "keys/supernode-0", OTHER)
    os.chown(key, OTHER, OTHER + 1)
    key.chmod(0o640)
    assert _pick("-r", key) == f"{OTHER}:{OTHER + 1}"


def test_missing_paths_are_ignored(app):
    assert _pick("-r", app / "certs" / "keys" / "absent", "-w", app / "absent") == "1000:1000"


def test_bad_arguments_are_refused():
    done = subprocess.run(["sh", str(PICK), "runs"], env=ENV, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "expected -r FILE or -w DIR" in done.stderr


# ------------------------------------------------------------------------ entrypoint.sh
WHO = 'echo "$(id -u):$(id -g)"'


@pytest.mark.parametrize("uid", [0, 1000, OTHER])
def test_supernode_runs_as_the_owner_of_its_key(app, uid):
    _key(app, "keys/supernode-0", uid)
    _key(app, "ca.crt", uid, mode=0o644)
    done = _entrypoint(app, "sh", "-c", f'{WHO}; cat "$0" >/dev/null', str(app / "certs" / "keys" / "supernode-0"))
    assert done.returncode == 0, done.stderr  # it could read its key
    assert done.stdout.split() == [f"{uid}:{uid}"]


@pytest.mark.parametrize("uid", [0, 1000, OTHER])
def test_superlink_writes_results_as_their_owner(app, uid):
    runs = _results(app, uid)
    _key(app, "server.key", uid)
    _key(app, "server.crt", uid, mode=0o644)
    _key(app, "ca.crt", uid, mode=0o644)
    done = _entrypoint(
        app,
        "sh",
        "-c",
        f'{WHO}; cat "$0" >/dev/null; touch "$1/metrics.jsonl"',
        str(app / "certs" / "server.key"),
        str(runs),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"{uid}:{uid}"]
    assert (runs / "metrics.jsonl").stat().st_uid == uid


def test_plain_supernode_without_mounts_runs_as_the_images_user(app):
    done = _entrypoint(app, "sh", "-c", f'{WHO}; echo "$HOME $FLWR_HOME"; touch "$FLWR_HOME/x"')
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1000:1000", "/tmp/home-1000", "/tmp/home-1000/.flwr"]


def test_state_volume_is_handed_to_the_chosen_uid(app):
    state = app / "state"
    state.mkdir()
    state.chmod(0o1777)
    (state / "superlink.db").write_text("")  # left by an earlier start as root
    _results(app, OTHER)
    done = _entrypoint(app, "sh", "-c", 'echo x >> "$0"', str(state / "superlink.db"))
    assert done.returncode == 0, done.stderr
    assert (state / "superlink.db").stat().st_uid == OTHER
