#!/usr/bin/env bash
# Final device call: FA4 installed (stage ran in the call before), then the side-by-side of the
# final binary with FA4 and every SDPA backend (fa3 suite, bf16, graph replay), then an A/B of
# base / final / f (the max as one chain) at bf16 d64. -> $OUT
set -u
cd "$(dirname "$0")/.."
START=$(date +%s)
bash scripts/prepare-fa4.sh install > /tmp/fa4-install.log 2>&1 || { echo "FA4 install failed"; tail -5 /tmp/fa4-install.log; }
tar xJf .carry-x/bundle.tar.xz
export FLASHCORE_CACHE_DIR=/tmp/fc-cache
mkdir -p /tmp/sbs /tmp/ab
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader | tee /tmp/sbs/gpu.txt
(while true; do nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader; sleep 1; done) > /tmp/sbs/clocks.txt 2>&1 &
CLK=$!
FLASHCORE_GIT_COMMIT=$(cat .carry-x/commit) BENCH_OUT=/tmp/sbs SUITE=fa3 timeout ${SBS_LIMIT:-330} bash scripts/bench-vs-sdpa.sh .carry-fc/flashcore-final --dtype bf16 --mode graph --graph-calls 10 --graph-reps 10 --warmup 5 > /tmp/sbs/log.txt 2>&1
kill $CLK
echo "side by side $(( $(date +%s) - START )) s"; tail -45 /tmp/sbs/table.txt 2>/dev/null || tail -20 /tmp/sbs/log.txt
REPS=5 timeout ${AB_LIMIT:-120} bash .carry-fc/ab.sh "base final f" "64" 2 > /tmp/ab/summary.txt 2>&1
tail -13 /tmp/ab/summary.txt
echo "total $(( $(date +%s) - START )) s"
tar czf $OUT/results.tgz -C /tmp sbs ab
