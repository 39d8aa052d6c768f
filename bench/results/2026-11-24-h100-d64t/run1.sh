#!/usr/bin/env bash
# d64t call 1: JIT warm-up beside the GPU tests (192-key blocks forced by the knob), then the A/B
# timing: R = shipped rule, A = FLASHCORE_BLOCK_M=128 FLASHCORE_BLOCK_N=192 (128x192, P in regs),
# B = FLASHCORE_BLOCK_N=192 (192x192 P in smem at Sq >= 1024; 128x192 below), fa3 suite d64,
# both dtypes, graph replay, two rounds in opposite orders. Everything lands in $OUT/d64t.tgz.
set -u
cd "$(dirname "$0")/.."
C=.carry-d64t
export FLASHCORE_CACHE_DIR=/tmp/fcc-d64t
md="$(cat $C/manifest_dir)"; mkdir -p "$md/target/release" && cp $C/flashcore "$md/target/release/flashcore"
W=$OUT/d64t; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader; date -u; cat $C/commit; } > $W/env.txt
cfg() { case $1 in R) echo "";; A) echo "FLASHCORE_BLOCK_M=128 FLASHCORE_BLOCK_N=192";; B) echo "FLASHCORE_BLOCK_N=192";; esac; }
# Warm-up: each config and dtype once (timings discarded).
for c in R A B; do for d in bf16 f16; do
  env $(cfg $c) timeout 150 $C/flashcore bench --suite fa3 --headdim 64 --dtype $d --mode event --reps 1 --warmup 1 > $W/warm-$c-$d.txt 2>&1 &
done; done
# Tests, in parallel with the warm-up (FLASHCORE_REQUIRE_GPU=1).
export FLASHCORE_REQUIRE_GPU=1
LIM=${LIM:-170}
t_run() { local name=$1 bin=$2; shift 2; local s=$(date +%s)
  if env "$@" timeout $LIM $C/tests/$bin --test-threads=3 > $W/test-$name.log 2>&1; then r=PASS; else r="FAIL(rc=$?)"; fi
  echo "$r $name ($(( $(date +%s) - s ))s): $(grep -E '^test result|panicked' $W/test-$name.log | head -3 | tr '\n' ' ')" >> $W/tests.txt; }
t_run keys192 gpu_keys192 A=1 &
t_run tile_inv_n192 gpu_tile_invariance FLASHCORE_BLOCK_N=192 &
t_run attention_n192 gpu_attention FLASHCORE_BLOCK_N=192 &
t_run attention_m128n192 gpu_attention FLASHCORE_BLOCK_M=128 FLASHCORE_BLOCK_N=192 &
t_run robustness_n192 gpu_robustness FLASHCORE_BLOCK_N=192 &
t_run oblivious_n192 gpu_oblivious FLASHCORE_BLOCK_N=192 &
t_run features_n192 gpu_features FLASHCORE_BLOCK_N=192 &
t_run keys176 gpu_keys176 A=1 &
wait; date -u >> $W/env.txt
unset FLASHCORE_REQUIRE_GPU
R="--mode graph --graph-reps 10 --graph-calls 10 --warmup 5"
for round in 1 2; do
  order="R A B"; [ $round = 2 ] && order="B A R"
  for c in $order; do for d in bf16 f16; do
    env $(cfg $c) timeout 60 $C/flashcore bench --suite fa3 --headdim 64 --dtype $d $R --json $W/fa3-$c-$d-r$round.json > $W/fa3-$c-$d-r$round.txt 2>&1
    echo "r$round $c $d rc=$? $(date -u +%T)" >> $W/timing.txt
  done; done
done
date -u >> $W/env.txt
cat $W/tests.txt $W/timing.txt
cd $OUT && tar czf d64t.tgz d64t && rm -rf d64t
