#!/usr/bin/env bash
# Set up, then lint (ruff), type-check (mypy) and run the test suite.
#   bash scripts/test.sh            the fast suite (pytest's default: -m "not slow", a few minutes)
#   bash scripts/test.sh --all      everything, the slow tests too (what CI runs)
# Other options pass through to pytest, e.g. bash scripts/test.sh --all --durations=25 -x
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
args=()
for arg in "$@"; do
  if [ "$arg" = --all ]; then
    args+=(-m "slow or not slow")
  else
    args+=("$arg")
  fi
done
venv="$(bash "$here/scripts/setup.sh" | tail -n 1)"
cd "$here"
# lint and format, the type check (all configured in pyproject.toml), then the tests
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
"$venv/bin/python" scripts/typecheck.py
exec "$venv/bin/python" -m pytest ${args[@]+"${args[@]}"}
