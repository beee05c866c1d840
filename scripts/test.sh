#!/usr/bin/env bash
# Set up, then lint (ruff) and run the test suite (pass pytest options through, e.g. -m "not slow").
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$(bash "$here/scripts/setup.sh" | tail -n 1)"
cd "$here"
# lint and format (configured in pyproject.toml), then the tests
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
exec "$venv/bin/python" -m pytest "$@"
