#!/usr/bin/env bash
# A second backward device call: cross-schedule bit identity by tensor, the backward
# GPU tests under the new defaults, old vs new defaults (graph replay, two rounds), one ncu profile.
set -uo pipefail
C="${1:-.carry-bwd}"
out="${OUT:-device-out}"; mkdir -p "$out" /tmp/fcj
export FLASHCORE_REQUIRE_GPU=1 FLASHCORE_CACHE_DIR=/tmp/fc-cache
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv | tee "$out/gpu.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 500 > "$out/smi.csv" 2>&1 &
SMI=$!
{
for case in "d128 --causal:0 1 2 3" "d64:0 1 2 3" "d128:0 3" "d64 --causal:0 3"; do
  IFS=: read args cores <<< "$case"; set -- $args; f="$C/in_$1.safetensors"; tag="$1${2:-}"
  for core in $cores; do
    FLASHCORE_BWD_ONEPASS=1 FLASHCORE_BWD_CORE=$core "$C/flashcore" attn --grad --input "$f" --output /tmp/fcj/o_${tag}_$core.safetensors ${2:-} > /tmp/fcj/attn_${tag}_$core.log 2>&1 || echo "FAIL run $args core $core: $(tail -1 /tmp/fcj/attn_${tag}_$core.log)"
  done
  for core in $cores; do [[ $core == 0 ]] && continue
    echo "$args core0 vs core$core: $(python3 "$C/samebits.py" /tmp/fcj/o_${tag}_0.safetensors /tmp/fcj/o_${tag}_$core.safetensors)"
  done
done
FLASHCORE_BWD_ONEPASS=0 "$C/flashcore" attn --grad --input "$C/in_d128.safetensors" --output /tmp/fcj/o_two.safetensors > /dev/null 2>&1
echo "d128 two-pass vs one-pass core0 (expected to differ: another fp32 order): $(python3 "$C/samebits.py" /tmp/fcj/o_two.safetensors /tmp/fcj/o_d128_0.safetensors)"
} 2>&1 | tee "$out/bits.txt"
el bits done
{
run_test() { local tag="$1"; shift; local bin="$1"; shift
  if timeout 60 env "$@" "$C/tests/$bin" > "/tmp/fcj/test-$tag.log" 2>&1; then echo "PASS $tag: $(grep -E '^test result' /tmp/fcj/test-$tag.log | tail -1)";
  else echo "FAIL $tag: $(grep -E '^test result|panicked' /tmp/fcj/test-$tag.log | head -3)"; fi; }
run_test gpu_backward gpu_backward X=1
run_test gpu_backward_hd gpu_backward_hd X=1
run_test gpu_backward_onepass_core1 gpu_backward FLASHCORE_BWD_ONEPASS=1 FLASHCORE_BWD_CORE=1
} 2>&1 | tee "$out/tests.txt"
el tests done
FLASHCORE_BWD_ONEPASS=1 FLASHCORE_BWD_CORE=3 timeout 45 ncu --clock-control none --kernel-name flashcore_bwd_onepass \
  --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters \
  -o /tmp/fcj/prof -f "$C/flashcore" bench --batch 2 --heads 16 --seqlen 8192 --headdim 128 --causal --dtype bf16 \
  --backward --mode event --reps 1 --warmup 1 > /tmp/fcj/ncu.log 2>&1
el ncu done
timeout 12 ncu -i /tmp/fcj/prof.ncu-rep --page details > "$out/ncu-details.txt" 2>&1
timeout 12 ncu -i /tmp/fcj/prof.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$out/ncu-source.csv.gz"
tail -3 /tmp/fcj/ncu.log
B="--suite backward --backward --mode graph --warmup 3 --graph-calls 4 --graph-reps 10"
for round in 1 2; do
  (( round == 2 && $(date +%s) - T0 > 105 )) && { el "round 2 skipped (time)"; break; }
  for cfg in two:0:0 one0:1:0 new:: ; do
    IFS=: read name one core <<< "$cfg"
    el "bench round $round $name"
    env ${one:+FLASHCORE_BWD_ONEPASS=$one} ${core:+FLASHCORE_BWD_CORE=$core} "$C/flashcore" bench $B --json /tmp/fcj/r${round}_$name.json > /tmp/fcj/r${round}_$name.txt 2>&1 || echo "bench $name failed"
    grep -E '^\[' /tmp/fcj/r${round}_$name.txt | sed "s/^/r$round $name: /"
  done
done 2>&1 | tee "$out/bench.txt"
el bench done
kill $SMI
el all done
tar czf "$out/logs.tgz" -C /tmp/fcj $(cd /tmp/fcj && ls *.json *.txt *.log 2>/dev/null)
