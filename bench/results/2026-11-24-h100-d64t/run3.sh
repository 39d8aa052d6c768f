#!/usr/bin/env bash
# d64t call 3: 192x192 with P stored by stmatrix (flashcore, M = FLASHCORE_BLOCK_N=192) against
# the call-1 build storing P with st.shared.b32 (flashcore-sts, S = FLASHCORE_BLOCK_N=192) and the
# shipped rule (R). Tests of the new build first (beside the JIT warm-up), then fa3 d64 both
# dtypes, graph, two rounds in opposite orders, then ncu of M at 2,32,8192,64 bf16.
set -u
cd "$(dirname "$0")/.."
C=.carry-d64t
export FLASHCORE_CACHE_DIR=/tmp/fcc-d64t
md="$(cat $C/manifest_dir)"; mkdir -p "$md/target/release" && cp $C/flashcore "$md/target/release/flashcore"
W=$OUT/d64t3; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader; date -u; cat $C/commit; } > $W/env.txt
bin() { case $1 in S) echo $C/flashcore-sts;; *) echo $C/flashcore;; esac; }
cfg() { case $1 in R) echo "";; *) echo "FLASHCORE_BLOCK_N=192";; esac; }
for c in R S M; do for d in bf16 f16; do
  env $(cfg $c) timeout 150 $(bin $c) bench --suite fa3 --headdim 64 --dtype $d --mode event --reps 1 --warmup 1 > /dev/null 2>&1 &
done; done
export FLASHCORE_REQUIRE_GPU=1
LIM=${LIM:-150}
t_run() { local name=$1 bin=$2; shift 2; local s=$(date +%s)
  if env "$@" timeout $LIM $C/tests/$bin --test-threads=3 > $W/test-$name.log 2>&1; then r=PASS; else r="FAIL(rc=$?)"; fi
  echo "$r $name ($(( $(date +%s) - s ))s): $(grep -E '^test result|panicked' $W/test-$name.log | head -3 | tr '\n' ' ')" >> $W/tests.txt; }
t_run keys192 gpu_keys192 A=1 &
t_run tile_inv_n192 gpu_tile_invariance FLASHCORE_BLOCK_N=192 &
t_run attention_n192 gpu_attention FLASHCORE_BLOCK_N=192 &
t_run robustness_n192 gpu_robustness FLASHCORE_BLOCK_N=192 &
t_run oblivious_n192 gpu_oblivious FLASHCORE_BLOCK_N=192 &
wait; date -u >> $W/env.txt
unset FLASHCORE_REQUIRE_GPU
R="--mode graph --graph-reps 10 --graph-calls 10 --warmup 5"
for round in 1 2; do
  order="R S M"; [ $round = 2 ] && order="M S R"
  for c in $order; do for d in bf16 f16; do
    env $(cfg $c) timeout 60 $(bin $c) bench --suite fa3 --headdim 64 --dtype $d $R --json $W/fa3-$c-$d-r$round.json > $W/fa3-$c-$d-r$round.txt 2>&1
    echo "r$round $c $d rc=$? $(date -u +%T)" >> $W/timing.txt
  done; done
done
date -u >> $W/env.txt
env FLASHCORE_BLOCK_N=192 timeout 100 /usr/local/cuda/bin/ncu -k regex:attention_fwd --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section InstructionStats --section LaunchStats \
  $C/flashcore bench --batch 2 --heads 32 --seqlen 8192 --headdim 64 --dtype bf16 --mode event --reps 2 --warmup 1 > $W/ncu-M.txt 2>&1
echo "ncu M rc=$? $(date -u +%T)" >> $W/timing.txt
cat $W/tests.txt $W/timing.txt
cd $OUT && tar czf d64t3.tgz d64t3 && rm -rf d64t3
