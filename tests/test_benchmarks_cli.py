"""benchmarks/overhead.py's command line: an override after ``--variants`` is an
override, not a variant (issue 32 item 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def overhead(load_script):
    return load_script("benchmarks/overhead.py")


def test_an_override_after_variants_is_moved_to_the_overrides(overhead):
    # Execute
    (argv,) = overhead.split_overrides(["--variants", "local:off", "model.name=mlp", "--cases", "k5", "--rounds=3"])
    # Assert: options keep their values; the override goes after "--"
    assert argv == ["--variants", "local:off", "--cases", "k5", "--rounds=3", "--", "model.name=mlp"]


def test_a_malformed_variant_is_refused_naming_it(monkeypatch, capsys, overhead):
    # Prepare
    monkeypatch.setattr("sys.argv", ["overhead.py", "--variants", "local:of"])
    # Execute
    with pytest.raises(SystemExit) as raised:
        overhead.main()
    # Assert: usage error (2), the bad variant named
    assert raised.value.code == 2
    assert "--variants local:of: a variant is BACKEND:VECTORIZE" in capsys.readouterr().err
