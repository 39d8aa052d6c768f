#!/usr/bin/env bash
# d64t call 2: controls that split call 1's slowdowns. R = shipped rule; C = FLASHCORE_BLOCK_M=128
# (128x128: the 128-row baseline of A); A = 128x192 (P in registers); B = FLASHCORE_BLOCK_N=192
# (192x192, P in smem, 2 stages); R2 = flashcore-r2, a control build whose 192-row d64 tiles have
# 2 K/V stages instead of 4 (192x128, P in registers). fa3 d64, both dtypes, graph, two rounds in
# opposite orders; then ncu sections of R, R2, B, A at 2,32,8192,64 bf16 non-causal.
set -u
cd "$(dirname "$0")/.."
C=.carry-d64t
export FLASHCORE_CACHE_DIR=/tmp/fcc-d64t
md="$(cat $C/manifest_dir)"; mkdir -p "$md/target/release" && cp $C/flashcore "$md/target/release/flashcore"
W=$OUT/d64t2; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader; date -u; cat $C/commit; } > $W/env.txt
bin() { case $1 in R2) echo $C/flashcore-r2;; *) echo $C/flashcore;; esac; }
cfg() { case $1 in R|R2) echo "";; C) echo "FLASHCORE_BLOCK_M=128";; A) echo "FLASHCORE_BLOCK_M=128 FLASHCORE_BLOCK_N=192";; B) echo "FLASHCORE_BLOCK_N=192";; esac; }
for c in R C A B R2; do for d in bf16 f16; do
  env $(cfg $c) timeout 150 $(bin $c) bench --suite fa3 --headdim 64 --dtype $d --mode event --reps 1 --warmup 1 > /dev/null 2>&1 &
done; done; wait; date -u >> $W/env.txt
R="--mode graph --graph-reps 10 --graph-calls 10 --warmup 5"
for round in 1 2; do
  order="R C A B R2"; [ $round = 2 ] && order="R2 B A C R"
  for c in $order; do for d in bf16 f16; do
    env $(cfg $c) timeout 60 $(bin $c) bench --suite fa3 --headdim 64 --dtype $d $R --json $W/fa3-$c-$d-r$round.json > $W/fa3-$c-$d-r$round.txt 2>&1
    echo "r$round $c $d rc=$? $(date -u +%T)" >> $W/timing.txt
  done; done
done
date -u >> $W/env.txt
NCU=/usr/local/cuda/bin/ncu
for c in R R2 B A; do
  env $(cfg $c) timeout 100 $NCU -k regex:attention_fwd --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section InstructionStats --section LaunchStats \
    $(bin $c) bench --batch 2 --heads 32 --seqlen 8192 --headdim 64 --dtype bf16 --mode event --reps 2 --warmup 1 > $W/ncu-$c.txt 2>&1
  echo "ncu $c rc=$? $(date -u +%T)" >> $W/timing.txt
done
date -u >> $W/env.txt
cat $W/timing.txt
cd $OUT && tar czf d64t2.tgz d64t2 && rm -rf d64t2
