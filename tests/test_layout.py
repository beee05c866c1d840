"""The dependency rules of the layout (README, "How it fits together"), read from the
code's own import statements: the core imports no strategy, no client and not the
composition root; strategies/ and clients/ never import each other; only
fedflex/launch/ (and ``python -m fedflex``) wires them together."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    """Top-level package names of one file's imports, with ``fedflex.strategies``,
    ``fedflex.clients`` and ``fedflex.launch`` as their own names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            for part in ("fedflex.launch", "fedflex.strategies", "fedflex.clients"):
                if name == part or name.startswith(part + "."):
                    found.add(part)
                    break
            else:
                found.add(name.split(".")[0])
    return found


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


CORE = [
    p
    for p in _files("fedflex")
    if not {"launch", "strategies", "clients"} & set(p.relative_to(ROOT).parts) and p.name != "__main__.py"
]


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_core_imports_no_strategy_no_client_and_not_the_launch_code(path):
    assert _imports(path).isdisjoint({"fedflex.strategies", "fedflex.clients", "fedflex.launch"})


@pytest.mark.parametrize("path", _files("strategies"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_server_side_imports_no_client_code(path):
    assert _imports(path).isdisjoint({"fedflex.clients", "fedflex.launch"})


#: the core modules only the composition root (fedflex/launch) wires into a run
WIRED_BY_THE_ROOT = {"data", "models", "partition", "progress", "interrupts", "evaluation"}


def _fedflex_modules(path: Path) -> set[str]:
    """The ``fedflex.<name>`` modules one file imports (first component after fedflex)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "fedflex":
                if len(parts) > 1:
                    found.add(parts[1])
                else:
                    found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "fedflex" and len(parts) > 1:
                    found.add(parts[1])
    return found


@pytest.mark.parametrize("path", _files("strategies"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_server_side_does_not_wire_data_models_or_the_run(path):
    # data, models, partitions, progress, interrupts and evaluation are the composition root's
    assert _fedflex_modules(path).isdisjoint(WIRED_BY_THE_ROOT)


def test_the_wiring_rule_catches_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from fedflex.data import load_dataset\nfrom fedflex import interrupts\n")
    assert _fedflex_modules(bad) >= {"data", "interrupts"}


@pytest.mark.parametrize("path", _files("clients"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_client_side_imports_no_server_code(path):
    assert _imports(path).isdisjoint({"fedflex.strategies", "fedflex.launch"})


def test_the_rule_catches_a_forbidden_import(tmp_path):
    # the check itself can fail: a file that imports a strategy is seen
    bad = tmp_path / "bad.py"
    bad.write_text("from fedflex.strategies.build import build_strategy\n")
    assert "fedflex.strategies" in _imports(bad)


FRAME_READS = ("_getframe", "currentframe", "inspect.stack", "f_back", "f_locals")


@pytest.mark.parametrize("folder", ["fedflex", "strategies", "clients"])
def test_no_code_reads_its_callers_stack_frames(folder):
    # issue 44: a strategy learns of a DP wrapper by being told (FedFlex.wrapper), not from the stack
    found = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in _files(folder)
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if any(word in line for word in FRAME_READS)
    ]
    assert found == []


def test_the_frame_rule_catches_a_frame_read(tmp_path):
    bad = "import sys\ncaller = sys._getframe(2).f_locals\n"
    assert any(word in bad for word in FRAME_READS)


@pytest.mark.parametrize("folder", ["fedflex", "strategies", "clients"])
def test_a_module_over_600_lines_says_why(folder):
    # issue 44: a long module is a choice, said in its docstring ("It is over 600 lines because ...")
    silent = [
        str(path.relative_to(ROOT))
        for path in _files(folder)
        if len(path.read_text().splitlines()) > 600
        and "over 600 lines because" not in (ast.get_docstring(ast.parse(path.read_text())) or "").replace("\n", " ")
    ]
    assert silent == []
