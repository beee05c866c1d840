#!/usr/bin/env bash
# Issue 32's GPU figures on a lent GPU machine (device tool), in two calls of one warm machine:
#   part local: carry .device/whl .device/fmnist .device/setup.sh
#   part ray:   carry .device/ray .device/setup.sh (right after, while the machine is warm)
#   source .device/setup.sh && bash benchmarks/gpu_overhead.sh local|ray [PAIRS] [ROUNDS]
# Each case is its own benchmarks/overhead.py invocation under a time limit, its output
# appended to $OUT/overhead-PART.txt as it comes, so a slow case costs only itself.
set -u -o pipefail
part=$1; pairs=${2:-1}; rounds=${3:-10}; out=${OUT:-/tmp}/overhead-$part.txt
case $part in
  local) variants="local:off local:on local:rule"; limit=110 ;;
  ray) variants="ray:off ray:on"; limit=110 ;;
  *) echo "part: local or ray" >&2; exit 2 ;;
esac
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } | tee -a "$out"
for c in k5 k100 k100of10k; do
  echo "== $c $variants pairs $pairs rounds $rounds" | tee -a "$out"
  timeout $limit python3 benchmarks/overhead.py --device cuda --cases $c --rounds "$rounds" --pairs "$pairs" \
    --variants $variants 2>&1 | tee -a "$out" || echo "== $c: exit ${PIPESTATUS[0]}" | tee -a "$out"
done
