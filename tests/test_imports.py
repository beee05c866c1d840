"""The package's import structure, read from the source by scripts/import_graph.py: no
import cycle, no private name imported from another module, no symbolic link in the tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_package_has_no_import_cycle_and_imports_no_private_name(load_script):
    graph = load_script("scripts/import_graph.py")
    edges, private = graph.edges()
    assert graph.cycles(edges) == []
    assert private == []
    # the walk sees the package as it installs: strategies/ as fedflex.strategies
    assert "fedflex.strategies.strategy" in edges["fedflex.launch.server"]


def test_the_walk_finds_a_cycle_through_a_function_level_import_and_a_private_name(tmp_path, load_script):
    # Prepare: a -> b at module level, b -> a inside a function; c takes b's private name;
    # d imports a only for annotations (not an edge)
    graph = load_script("scripts/import_graph.py")
    root = _tree(
        tmp_path,
        {
            "fedflex/__init__.py": "",
            "fedflex/a.py": "from fedflex import b\n",
            "fedflex/b.py": "def f():\n    from fedflex.a import g\n",
            "fedflex/c.py": "from fedflex.b import _hidden\n",
            "strategies/__init__.py": "",
            "strategies/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fedflex.a import g\n",
            "clients/__init__.py": "",
        },
    )
    # Execute
    edges, private = graph.edges(root)
    # Assert
    assert graph.cycles(edges) == [["fedflex.a", "fedflex.b"]]
    assert private == ["fedflex.c: fedflex.b._hidden"]
    assert edges["fedflex.strategies.d"] == set()


def test_the_checkout_holds_no_symbolic_link():
    tracked = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert [line.split("\t")[1] for line in tracked.splitlines() if line.startswith("120000")] == []
    sides = ("fedflex", "strategies", "clients")
    assert [p for side in sides for p in (ROOT / side).rglob("*") if p.is_symlink()] == []


def test_a_checkout_without_an_install_maps_only_the_two_halves(tmp_path):
    # Execute: fedflex from the checkout (no install on the path), from another folder
    code = (
        "import importlib.util, fedflex.strategies.named as n, fedflex.clients.helpers as h;"
        "print(n.__file__, h.__file__, importlib.util.find_spec('fedflex.tests'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); {code}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Assert: the top-level folders, and nothing else of the checkout, are fedflex.*
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(ROOT / "strategies" / "named.py"), str(ROOT / "clients" / "helpers.py"), "None"]
