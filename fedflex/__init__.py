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
import os
from typing import Any

__version__ = "0.1.0"

# The server and client halves live in the top-level folders strategies/ and clients/ (the
# project's layout) and are imported as fedflex.strategies / fedflex.clients, so that an
# installed fedflex claims no top-level name but its own. In a checkout, fedflex/strategies
# and fedflex/clients are symbolic links to those folders, and a built wheel holds their
# files there. Where the links are absent (a Flower app bundle, FAB, which skips links; a
# checkout without link support) the folder above this package is searched as well.
_here = os.path.dirname(os.path.abspath(__file__))
if not os.path.isdir(os.path.join(_here, "strategies")) and os.path.isfile(
    os.path.join(os.path.dirname(_here), "strategies", "__init__.py")
):
    __path__.append(os.path.dirname(_here))  # noqa: F821 (a package's own __path__)

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
