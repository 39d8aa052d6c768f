#!/usr/bin/env bash
# Device call 2: A/B bench (base c d e; bf16 d64 d128, f16 d64), then the GPU tests of d, and a
# seed replay of the varlen-backward case that failed in call 1 (d and base). -> $OUT/results.tgz
set -u
cd "$(dirname "$0")/.."
tar xJf .carry-x/bundle.tar.xz
export FLASHCORE_CACHE_DIR=/tmp/fc-cache
md=$(cat .carry-t/manifest_dir); mkdir -p $md/target/release && cp .carry-t/flashcore $md/target/release/flashcore
START=$(date +%s); mkdir -p /tmp/ab /tmp/t
REPS=5 timeout 300 bash .carry-fc/ab.sh "${BINS:-base c d e}" "${DIMS:-64 128 f64}" 2 > /tmp/ab/summary.txt 2>&1
echo "bench phase $(( $(date +%s) - START )) s"; tail -40 /tmp/ab/summary.txt
export FLASHCORE_REQUIRE_GPU=1
( for s in 15419148197405926128; do for b in .carry-t/tests/gpu_varlen_backward .carry-t/base_gpu_varlen_backward; do
  [ -x $b ] && FLASHCORE_SEED=$s timeout 200 $b --test-threads=1 varlen_feature_gradients_match_reference > /tmp/t/replay-$(basename $b).log 2>&1; echo "replay $b rc=$?"; done; done ) > /tmp/t/replay.txt 2>&1 &
ls .carry-t/tests | xargs -P 5 -I{} sh -c 'timeout '${TEST_LIMIT:-330}' .carry-t/tests/{} --test-threads=1 > /tmp/t/{}.log 2>&1; echo "{} rc=$? $(grep -E "^test result" /tmp/t/{}.log | tail -1)"' | tee /tmp/t/summary.txt
wait; cat /tmp/t/replay.txt
echo "total $(( $(date +%s) - START )) s"
tar czf $OUT/results.tgz -C /tmp ab t
