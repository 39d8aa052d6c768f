#!/bin/bash
# The recorded device run of issue 13 (SECURITY.md, "Latest leakage table"): every value class of
# the shipped kernel measured three ways (queued time, cycle timer, hardware floor) at 100 000
# measurements each, the one-random self-check queued and unqueued, both power controls (the
# skip-past-length one with the cycle timer: the timer's own power check), secret-length mode.
# About 3–5 minutes on an H100 at 1,8,512,64 (each measurement capped at --budget-s).
#
#   bash scripts/leakage-issue13.sh [FLASHCORE_BINARY] [OUTPUT_DIR]
#
# Writes log.txt and one JSON file per command into OUTPUT_DIR (default: $OUT, else
# ./leakage-issue13). Needs a GPU; kernels compile at first use (NVRTC).
set -u
B=${1:-target/release/flashcore}
D=${2:-${OUT:-leakage-issue13}}
mkdir -p "$D"
exec > >(tee -a "$D/log.txt") 2>&1
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv 2>/dev/null || true
git log --oneline -1 2>/dev/null || true
t0=$(date +%s)
step() {
    local name=$1
    shift
    echo "== $name: $B leakage $*"
    "$B" leakage "$@" --json "$D/$name.json"
    echo "rc=$? elapsed=$(($(date +%s) - t0))s"
}
step shipped --budget-s 20
step one-random --budget-s 20 --class one-random
step one-random-unqueued --budget-s 20 --class one-random --queue-us 0 --no-cycles --no-floor
step control-early-exit --budget-s 20 --control early-exit --class zeros
step control-skip-past-length --budget-s 20 --control skip-past-length --class len-0
step secret-len --budget-s 15 --secret-len
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>/dev/null || true
