"""Type-check the fedflex package as it installs: mypy on fedflex/ with strategies/ and
clients/ in it as fedflex.strategies and fedflex.clients.

mypy maps module names to files by folders and cannot follow pyproject.toml's package-dir
(nor the import hook of an editable install), so the three folders are copied into
``build/typecheck/fedflex/`` (copies, refreshed on each call; the tree holds no links) and
mypy runs there with pyproject.toml's settings. File names in its report are those of the
checkout. Extra arguments pass through to mypy.

    python scripts/typecheck.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGE = ROOT / "build" / "typecheck"
#: staged folder -> the checkout's folder
FOLDERS = {"fedflex": "fedflex", "fedflex/strategies": "strategies", "fedflex/clients": "clients"}


def stage() -> None:
    """Copy the package's sources into :data:`STAGE` (only files that changed; stale ones removed)."""
    wanted = {}
    for staged, source in FOLDERS.items():
        for path in (ROOT / source).rglob("*.py"):
            wanted[STAGE / staged / path.relative_to(ROOT / source)] = path
    for path in list(STAGE.rglob("*.py")) if STAGE.is_dir() else []:
        if path not in wanted:
            path.unlink()
    for target, source in wanted.items():
        if not target.exists() or target.read_bytes() != source.read_bytes():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)


def checkout_path(line: str) -> str:
    """Return a mypy report line with its staged file name replaced by the checkout's."""
    for staged, source in sorted(FOLDERS.items(), key=lambda kv: -len(kv[0])):
        if line.startswith(staged + "/"):
            return source + line[len(staged) :]
    return line


def main(argv: list[str]) -> int:
    stage()
    mypy = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    env = {**os.environ, "MYPY_CACHE_DIR": str(STAGE / ".mypy_cache")}
    proc = subprocess.run([*mypy, *argv], cwd=STAGE, env=env, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        print(checkout_path(line))
    sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
