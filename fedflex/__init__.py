"""fedflex: composable Flower strategies for federations whose clients come and go.

As a library::

    import fedflex

    run = fedflex.run("scenarios/quickstart.yaml", ["rounds=5"])  # in memory
    run.rows, run.summary, run.model
    fedflex.load_run("runs/quickstart-20260101-120000")
    fedflex.compare(["runs/samplers"], target=0.5)  # the compare table as a list of dicts

The names below are loaded on first use: ``import fedflex`` (and the ``fedflex``
command's start) stays light, with no torch, Flower or strategy import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
from typing import Any

__version__ = "0.1.0"

# The server and client halves live in the top-level folders strategies/ and clients/ (the
# project's layout) and are imported as fedflex.strategies / fedflex.clients, so that an
# installed fedflex claims no top-level name but its own. A wheel holds them under
# fedflex/, an editable install maps them (pyproject.toml's package-dir). A checkout used
# without an install, and a Flower app bundle (FAB) under `flwr run`, have the folders
# beside this package instead: this finder maps the two names (and only them) to them.
_here = os.path.dirname(os.path.abspath(__file__))
_SIDES = ("strategies", "clients")


class _SideFinder(importlib.abc.MetaPathFinder):
    """``fedflex.strategies`` / ``fedflex.clients`` -> the folders beside this package."""

    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        package, _, side = fullname.partition(".")
        if package != __name__ or side not in _SIDES:
            return None
        folder = os.path.join(self.root, side)
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
        )


if not os.path.isdir(os.path.join(_here, "strategies")) and os.path.isfile(
    os.path.join(os.path.dirname(_here), "strategies", "__init__.py")
):
    # first: the halves come from beside the fedflex that was imported, even where an
    # editable install of another checkout would map them elsewhere
    sys.meta_path.insert(0, _SideFinder(os.path.dirname(_here)))

# public name -> the module that defines it
_EXPORTS = {
    "run": "fedflex.launch.api",
    "load_run": "fedflex.launch.api",
    "Run": "fedflex.launch.api",
    "ScenarioConfig": "fedflex.config",
    "ConfigError": "fedflex.config",
    "load_scenario": "fedflex.loader",
    "compare": "fedflex.study.compare",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fedflex' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
