#!/usr/bin/env bash
# After prepare-fa4.sh install: the backward suite (event mode, as PyTorch has no graph replay of
# the backward) and the fa3 suite (graph) beside every SDPA backend and FA4. -> $OUT/sbs.tgz
set -u
cd "$(dirname "$0")/.."
export FLASHCORE_CACHE_DIR=/tmp/fc-cache FLASHCORE_GIT_COMMIT=$(cat .carry-f/commit)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
S=$(date +%s)
SUITE=backward BENCH_OUT=/tmp/sbs/bwd timeout 260 bash scripts/bench-vs-sdpa.sh .carry-f/flashcore --backward --mode event 2>&1 | tail -16
echo "backward done $(( $(date +%s) - S )) s"
SUITE=fa3 BENCH_OUT=/tmp/sbs/fa3 timeout 280 bash scripts/bench-vs-sdpa.sh .carry-f/flashcore --dtype bf16 --mode graph --graph-calls 10 --graph-reps 10 --warmup 5 2>&1 | tail -40
echo "fa3 done $(( $(date +%s) - S )) s"
tar czf $OUT/sbs.tgz -C /tmp sbs
