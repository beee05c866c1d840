#!/usr/bin/env bash
# Set up fedflex on a fresh machine (idempotent; fast when already done):
# - Fashion-MNIST from Debian's dataset-fashion-mnist package (when root and apt-get exist);
# - a virtual environment OUTSIDE the clone ($FEDFLEX_VENV, default ~/.venvs/fedflex), so
#   re-runs and CI reuse the multi-GB torch install instead of redoing it;
# - fedflex installed into it (editable) with its test extra, at the tested versions of
#   constraints.txt; FEDFLEX_NEWEST=1 installs the newest releases the pins in
#   pyproject.toml allow instead (then run the tests before trusting a result).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FEDFLEX_VENV:-$HOME/.venvs/fedflex}"

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing dataset-fashion-mnist (apt-get)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist) >/dev/null \
      || echo "setup: could not install dataset-fashion-mnist; FMNIST scenarios will need FEDFLEX_DATA" >&2
  else
    echo "setup: no Debian Fashion-MNIST and no root apt-get; FMNIST scenarios will need FEDFLEX_DATA" >&2
  fi
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
fi
# One venv serves every checkout that uses it: installing re-points its editable fedflex
# at this checkout, so say so when it ran another one's code (`fedflex` warns as well
# when run inside a checkout that is not the one it runs)
before="$(cd / && "$venv/bin/python" -c 'import fedflex, os; print(os.path.dirname(os.path.dirname(os.path.realpath(fedflex.__file__))))' 2>/dev/null || true)"
if [ -n "$before" ] && [ "$before" != "$here" ]; then
  echo "setup: $venv ran the fedflex of $before; it now runs this checkout's ($here)" >&2
fi
# torchvision's wheels pin a matching (CUDA-built) torch that also runs on the CPU;
# pinning the CPU-only torch 2.13 breaks torchvision's operators (see README).
if [ "${FEDFLEX_NEWEST:-0}" = 1 ]; then
  echo "setup: FEDFLEX_NEWEST=1: installing the newest allowed releases (not constraints.txt)" >&2
  "$venv/bin/pip" install -q --upgrade --upgrade-strategy eager -e "$here[test]"
else
  "$venv/bin/pip" install -q -e "$here[test]" -c "$here/constraints.txt"
fi
echo "$venv"
