"""Fixtures shared by the test packages."""

import logging
import sys
from pathlib import Path

import pytest

QUICKSTART_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "flower-quickstart"


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """A fresh partition cache and no cached worker task (clients.runtime.get_task)."""
    import fedflex.clients.runtime as runtime

    monkeypatch.setenv("FEDFLEX_CACHE", str(tmp_path / "cache"))
    runtime.get_task.cache_clear()
    yield
    runtime.get_task.cache_clear()


@pytest.fixture
def quickstart_example(monkeypatch):
    """Flower's quickstart app (examples/flower-quickstart) importable as
    ``flowerquickstart``, on synthetic data; its modules forgotten afterwards."""
    monkeypatch.setenv("QUICKSTART_SYNTHETIC", "1")
    monkeypatch.syspath_prepend(str(QUICKSTART_EXAMPLE))
    yield
    for name in [m for m in sys.modules if m.startswith("flowerquickstart")]:
        del sys.modules[name]


class _Records(logging.Handler):
    """Keeps the records of one logger, whatever its propagation."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def flower_records():
    """The records logged on Flower's logger during the test, each once: a handler on the
    ``flwr`` logger itself (caplog sees Flower's records only while it propagates, and
    then twice wherever an earlier in-process run left handlers on it).
    """
    handler, flwr_logger = _Records(), logging.getLogger("flwr")
    flwr_logger.addHandler(handler)
    yield handler.records
    flwr_logger.removeHandler(handler)


@pytest.fixture
def load_script():
    """Load a script of the repository (``benchmarks/x.py``, ``scripts/x.py``) as a module."""
    import importlib.util

    def load(relative: str):
        path = Path(__file__).resolve().parent.parent / relative
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
