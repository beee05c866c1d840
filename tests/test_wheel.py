"""fedflex installed from a built wheel (not editable) works beside a user's own
top-level ``strategies`` and ``clients`` packages: its server and client halves are
``fedflex.strategies`` and ``fedflex.clients`` (the top-level folders of the checkout,
mapped by pyproject.toml's package-dir), and the wheel claims no other top-level name."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
TINY = [
    "rounds=2",
    "num_clients=6",
    "dataset.samples_per_client=40",
    "strategy.sampler.clients_per_round=3",
    "simulation.backend=local",
    "output.progress=off",
]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (found,) = out.glob("fedflex-*.whl")
    return found


def test_the_wheel_holds_only_the_fedflex_package(wheel):
    # Execute
    with zipfile.ZipFile(wheel) as whl:
        tops = {name.split("/")[0] for name in whl.namelist() if not name.split("/")[0].endswith(".dist-info")}
        names = set(whl.namelist())
    # Assert: one top-level name; the server and client halves inside it
    assert tops == {"fedflex"}
    assert {"fedflex/strategies/named.py", "fedflex/clients/client_app.py"} <= names
    # every module of the three folders, none left out of pyproject.toml's package list
    sources = {
        f"fedflex/{side}/{p.relative_to(ROOT / side)}" if side != "fedflex" else str(p.relative_to(ROOT))
        for side in ("fedflex", "strategies", "clients")
        for p in (ROOT / side).rglob("*.py")
    }
    assert sources - names == set()


@pytest.mark.slow  # a venv, the wheel installed into it, a short run: about 30 s
def test_an_installed_wheel_works_beside_a_users_own_strategies_package(wheel, tmp_path):
    # Prepare: a venv with the wheel (its dependencies from this environment, no editable
    # fedflex: a .pth in a non-site directory is not processed) and a user's Flower
    # project whose own `strategies` and `clients` packages come first on the path
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    project = tmp_path / "project"
    for name in ("strategies", "clients"):
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text(f"MINE = {name!r}\n")
    code = textwrap.dedent(
        f"""
        import strategies, clients, fedflex
        from fedflex.strategies import HiCSFL
        run = fedflex.run({str(QUICKSTART)!r}, {TINY!r})
        print(strategies.MINE, clients.MINE, fedflex.__file__.startswith({str(site)!r}), len(run.rows), run.status)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["FEDFLEX_CACHE"] = str(tmp_path / "cache")
    # Execute
    proc = subprocess.run([str(python), "-c", code], cwd=project, env=env, capture_output=True, text=True, timeout=300)
    # Assert: the user's packages stay the user's; fedflex runs from the wheel
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "strategies clients True 2 completed"


def test_a_flower_app_bundle_imports_the_halves_from_its_own_top_level_folders(tmp_path):
    # Prepare: the FAB `flwr run .` ships (the checkout's folders as they are), unpacked
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    flwr = Path(sys.executable).parent / "flwr"
    source = tmp_path / "app"
    subprocess.run(
        ["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(source)], check=True, capture_output=True, timeout=120
    )
    subprocess.run([str(flwr), "build", "--app", str(source)], cwd=tmp_path, check=True, capture_output=True, env=env)
    (fab,) = tmp_path.glob("*.fab")
    unpacked = tmp_path / "unpacked"
    with zipfile.ZipFile(fab) as bundle:
        assert not any(name.startswith("fedflex/strategies/") for name in bundle.namelist())  # only strategies/
        bundle.extractall(unpacked)
    code = "import fedflex.strategies.strategy as s, fedflex.clients.client_app as c; print(s.__file__, c.__file__)"
    # Execute: the bundle's folder first on the path, as Flower's app loading puts it
    proc = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(unpacked)!r}); {code}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Assert: both halves come from the bundle's top-level folders
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [
        str(unpacked / "strategies" / "strategy.py"),
        str(unpacked / "clients" / "client_app.py"),
    ]
