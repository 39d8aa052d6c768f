#!/usr/bin/env bash
# A backward device call: cross-schedule bit identity, the backward GPU tests, the
# one-pass cores A/B (FLASHCORE_BWD_CORE) beside the two passes, graph replay, and one ncu profile.
# Run from the checkout root with the carried folder as $1 (binaries built on the CPU machine).
set -uo pipefail
C="${1:-.carry-bwd}"
out="${OUT:-device-out}"; mkdir -p "$out" /tmp/fcj
export FLASHCORE_REQUIRE_GPU=1 FLASHCORE_CACHE_DIR=/tmp/fc-cache
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv | tee "$out/gpu.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 500 > /tmp/fcj/smi.csv 2>&1 &
SMI=$!
# 1. Same bits from every schedule (same arithmetic, same order): dq, dk, dv of cores 0, 2, 3.
{
for case in "d128 --causal" "d128" "d64 --causal" "d64"; do
  set -- $case; f="$C/in_$1.safetensors"; tag="$1${2:-}"
  for core in 0 2 3; do
    FLASHCORE_BWD_ONEPASS=1 FLASHCORE_BWD_CORE=$core "$C/flashcore" attn --grad --input "$f" --output /tmp/fcj/o_${tag}_$core.safetensors ${2:-} > /tmp/fcj/attn_${tag}_$core.log 2>&1 || echo "FAIL run $case core $core: $(tail -1 /tmp/fcj/attn_${tag}_$core.log)"
  done
  for core in 2 3; do
    cmp -s /tmp/fcj/o_${tag}_0.safetensors /tmp/fcj/o_${tag}_$core.safetensors && echo "SAME BITS $case: core0 = core$core" || echo "DIFFERENT BITS $case: core0 vs core$core"
  done
done
} 2>&1 | tee "$out/bits.txt"
el bits done
# 2. Tests.
{
run_test() { local tag="$1"; shift; local bin="$1"; shift
  if timeout 150 env "$@" "$C/tests/$bin" > "/tmp/fcj/test-$tag.log" 2>&1; then echo "PASS $tag: $(grep -E '^test result' /tmp/fcj/test-$tag.log | tail -1)";
  else echo "FAIL $tag: $(grep -E '^test result|panicked' /tmp/fcj/test-$tag.log | head -3)"; fi; }
run_test gpu_backward gpu_backward X=1
run_test gpu_backward_onepass_core3 gpu_backward FLASHCORE_BWD_ONEPASS=1 FLASHCORE_BWD_CORE=3
run_test gpu_backward_onepass_core2 gpu_backward FLASHCORE_BWD_ONEPASS=1 FLASHCORE_BWD_CORE=2
run_test gpu_backward_features gpu_backward_features X=1
run_test gpu_backward_hd gpu_backward_hd X=1
run_test gpu_varlen_backward gpu_varlen_backward X=1
} 2>&1 | tee "$out/tests.txt"
el tests done
# 3. A/B: the backward suite per configuration, graph replay, two rounds alternating.
B="--suite backward --backward --mode graph --warmup 3 --graph-calls 4 --graph-reps 10"
for round in 1 2; do
  for cfg in two:0:0 core0:1:0 core1:1:1 core2:1:2 core3:1:3; do
    IFS=: read name one core <<< "$cfg"
    [[ $round == 2 && $name == core1 ]] && continue
    el "bench round $round $name"
    FLASHCORE_BWD_ONEPASS=$one FLASHCORE_BWD_CORE=$core "$C/flashcore" bench $B --json /tmp/fcj/r${round}_$name.json > /tmp/fcj/r${round}_$name.txt 2>&1 || echo "bench $name failed"
    grep -E 'bwd|f\+b' /tmp/fcj/r${round}_$name.txt | sed "s/^/r$round $name: /" | head -14
  done
done 2>&1 | tee "$out/bench.txt"
el bench done
kill $SMI; cp /tmp/fcj/smi.csv "$out/smi.csv"
# 4. One profile (if time is left): core 3 at 2,16,8192,128 causal, source-level stall samples.
if (( $(date +%s) - T0 < 200 )); then
  FLASHCORE_BWD_ONEPASS=1 FLASHCORE_BWD_CORE=3 timeout 70 ncu --clock-control none --kernel-name flashcore_bwd_onepass \
    --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters \
    --section SchedulerStats --section ComputeWorkloadAnalysis -o /tmp/fcj/prof -f \
    "$C/flashcore" bench --batch 2 --heads 16 --seqlen 8192 --headdim 128 --causal --dtype bf16 --backward \
    --mode event --reps 1 --warmup 1 > /tmp/fcj/ncu.log 2>&1
  ncu -i /tmp/fcj/prof.ncu-rep --page details > "$out/ncu-details.txt" 2>&1
  ncu -i /tmp/fcj/prof.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$out/ncu-source.csv.gz"
  tail -5 /tmp/fcj/ncu.log
fi
el all done
tar czf "$out/logs.tgz" -C /tmp/fcj $(cd /tmp/fcj && ls *.json *.txt *.log 2>/dev/null)
