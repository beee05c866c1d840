"""Fixtures shared by the test packages."""

import pytest


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """A fresh partition cache and no cached worker task (clients.runtime.get_task)."""
    import fedflex.clients.runtime as runtime

    monkeypatch.setenv("FEDFLEX_CACHE", str(tmp_path / "cache"))
    runtime.get_task.cache_clear()
    yield
    runtime.get_task.cache_clear()
