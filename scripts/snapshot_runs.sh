#!/usr/bin/env bash
# Behaviour snapshot for refactors: run the shipped scenarios that need no download for 3
# rounds with the code of TREE (python -m fedflex from that tree) into OUT/<scenario>/.
# Compare two trees' snapshots with scripts/snapshot_compare.py OLD NEW.
#   bash scripts/snapshot_runs.sh /tmp/old-checkout /tmp/snap_old
#   bash scripts/snapshot_runs.sh "$PWD" /tmp/snap_new
# SNAPSHOT_OVERRIDES adds overrides to every run of one tree, e.g. simulation.vectorize=off
# for a tree whose default trains in cohorts (bit-level differences from one at a time).
set -uo pipefail
tree=$(cd "$1" && pwd); out=$2; mkdir -p "$out"
py="${FEDFLEX_VENV:-$HOME/.venvs/fedflex}/bin/python"
common=(rounds=3 simulation.backend=local output.plots=false output.progress=off ${SNAPSHOT_OVERRIDES:-})
run() {
  local name=$1; shift
  (cd "$tree" && FEDFLEX_CACHE="${FEDFLEX_CACHE:-/tmp/fedflex-snapshot-cache}" PYTHONPATH="$tree" \
    "$py" -m fedflex run "scenarios/$name.yaml" "${common[@]}" "$@" --out "$out/$name" >"$out/$name.log" 2>&1)
  echo "$name rc=$?" | tee -a "$out/rc.txt"
}
run quickstart
run fmnist_markov num_clients=20 strategy.sampler.clients_per_round=4
run session_init_fmnist
run hics_fmnist
run divfl_fmnist
run fedcor_fmnist
run fedaware_fmnist num_clients=30
run fedaware_fmnist_authors num_clients=30
run feddyn_fmnist num_clients=30
run fedcm_fmnist num_clients=30
run fedams_fmnist num_clients=30
run bherd_fmnist_svm
run bherd_fmnist_cnn
run composed_markov
run bench_fmnist
