"""What ``flwr run`` ships: the app's FAB holds the code and scenarios only, and a file the
FAB cannot carry (a comma in its path, as in a ``fedflex sweep`` results folder) is refused
before the run is submitted, with the file named, instead of failing the ServerApp."""

from __future__ import annotations

import pytest

from fedflex.launch.deploy.certs import REPO_ROOT
from fedflex.launch.deploy.federation import fab_paths
from fedflex.launch.deploy.processes import DeployError

PYPROJECT = """[project]
name = "someapp"
version = "1.0.0"

[tool.flwr.app]
publisher = "someone"

[tool.flwr.app.components]
serverapp = "someapp.server:app"
clientapp = "someapp.client:app"
"""


def test_the_repository_fab_holds_the_app_and_no_results_docs_or_tests():
    paths = fab_paths(REPO_ROOT)
    assert {"fedflex/launch/server.py", "clients/client_app.py", "scenarios/quickstart.yaml", "README.md"} <= set(paths)
    assert not [p for p in paths if p.split("/")[0] in ("docs", "tests", "benchmarks", "examples", "scripts")]
    assert not [p for p in paths if "," in p]


def test_a_path_with_a_comma_is_refused_with_its_name(tmp_path):
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "someapp").mkdir()
    (tmp_path / "someapp" / "server.py").write_text("app = None\n")
    member = tmp_path / "results" / "method=hics,seed=0"
    member.mkdir(parents=True)
    (member / "summary.json").write_text("{}")
    with pytest.raises(DeployError, match=r"(?s)1 file\(s\).*results/method=hics,seed=0/summary.json.*fab-exclude"):
        fab_paths(tmp_path)
    # Flower's own way out, named in the message, works
    (tmp_path / "pyproject.toml").write_text(
        PYPROJECT.replace('publisher = "someone"\n', 'publisher = "someone"\nfab-exclude = ["results/**"]\n')
    )
    assert fab_paths(tmp_path) == ["someapp/server.py"]
