#!/bin/bash
# The recorded device run of issue 13 (docs/journal/leakage.md; summary in docs/security.md, "Measured on the H100"): every value class of
# the shipped kernel measured four ways (queued time, cycle timer, hardware floor, the floor's
# cycle timer) at 100 000 measurements each, the one-random self-check (all four builds) queued
# and unqueued, both power controls (the skip-past-length one with the cycle timer: the timer's
# own power check; no floor under a control), secret-length mode (time and cycles; no floor
# there: the floor build masks by the secret length as the shipped kernel does).
# About 3.5–4 minutes on an H100 at 1,8,512,64: 100 000 measurements take ~5 s per build, and
# each build's measurement is capped at --budget-s (a capped one says "(budget)" in its n column).
#
#   bash scripts/leakage-runs.sh [FLASHCORE_BINARY] [OUTPUT_DIR]
#
# Writes log.txt and one JSON file (schema flashcore-leakage, version 3) per command into
# OUTPUT_DIR (default: $OUT, else ./leakage-runs). Needs a GPU; kernels compile at first use
# (NVRTC). Exit status: 0 when every step ran (whatever its verdict: see each step's rc= line),
# 2 when a step could not measure (rc 2: usage, device or too few measurements).
set -u
B=${1:-target/release/flashcore}
D=${2:-${OUT:-leakage-runs}}
mkdir -p "$D"
exec > >(tee -a "$D/log.txt") 2>&1
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv 2>/dev/null || true
git log --oneline -1 2>/dev/null || true
"$B" --version 2>/dev/null || true
t0=$(date +%s)
status=0
step() {
    local name=$1
    shift
    echo "== $name: $B leakage $*"
    "$B" leakage "$@" --json "$D/$name.json"
    local rc=$?
    [ "$rc" -ge 2 ] && status=2
    echo "rc=$rc elapsed=$(($(date +%s) - t0))s"
}
step shipped --budget-s 20
step one-random --budget-s 20 --class one-random
step one-random-unqueued --budget-s 20 --class one-random --queue-us 0 --no-cycles --no-floor
step control-early-exit --budget-s 20 --control early-exit --class zeros
step control-skip-past-length --budget-s 20 --control skip-past-length --class len-0
step secret-len --budget-s 20 --secret-len
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>/dev/null || true
echo "total $(($(date +%s) - t0))s, status $status"
exit $status
