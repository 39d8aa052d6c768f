#!/usr/bin/env bash
# The one pass's core 4 (the dQ writer pipelined) against core 3 on the GPU
# machine, from binaries built here by scripts/build-carry.sh into .carry/ (the device has no Rust).
#   run from the checkout root, carry .carry:  bash scripts/bwd-writer-device.sh [CARRY_DIR]
# 1. bits: dq, dk, dv (and out) of core 4 = core 3's, tensor by tensor, on seven inputs (GQA, partial
#    tiles, d64/d128, causal and not, up to 188 tiles per CTA), and core 4 run to run;
# 2. the backward GPU tests with FLASHCORE_BWD_CORE=4 forced (gpu_backward also with the one pass
#    everywhere), FLASHCORE_REQUIRE_GPU=1; the two long ones run beside step 1 (own kernel cache);
# 3. A/B, backward alone, graph replay (10 calls × 6 reps, warmup 3), FLASHCORE_BWD_ONEPASS=1,
#    cores 3 and 4 at 2,16,8192,128 causal and not, 4,32,4096,64 causal, 8,16,2048,128, two rounds
#    in opposite orders, nvidia-smi clocks sampled;
# 4. if time is left (< 330 s so far), one ncu profile of core 4 at 2,16,8192,128 causal.
# Returns in $OUT (≤ 8 files): summary.txt (everything below, short), bits.txt, tests.txt, bench.txt,
# logs.tgz (all logs, bench JSON, smi.csv), ncu-details.txt, ncu-source.csv.gz. Budget ~6–7 min.
set -uo pipefail
cd "$(dirname "$0")/.."
C="${1:-.carry}"
out="${OUT:-device-out}"; W=/tmp/fcw; mkdir -p "$out" "$W"
export FLASHCORE_REQUIRE_GPU=1 FLASHCORE_CACHE_DIR=/tmp/fcw-cache
export FLASHCORE_GIT_COMMIT="$(cat "$C/commit" 2>/dev/null || true)"
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
# Tests that run the CLI find it where cargo built it: recreate that path (scripts/device-check.sh).
if [[ -f "$C/manifest_dir" ]]; then
  md="$(cat "$C/manifest_dir")"; mkdir -p "$md/target/release" && cp "$C/flashcore" "$md/target/release/flashcore"
fi
{ echo "commit $FLASHCORE_GIT_COMMIT"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv
} > "$W/gpu.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 500 > "$W/smi.csv" 2>&1 &
SMI=$!

run_test() { local tag="$1" bin="$2"; shift 2
  local t=$(date +%s)
  if timeout 200 env "$@" "$C/tests/$bin" > "$W/test-$tag.log" 2>&1; then
    echo "PASS $tag ($(( $(date +%s) - t ))s): $(grep -E '^test result' "$W/test-$tag.log" | tail -1)"
  else echo "FAIL $tag: $(grep -E '^test result|panicked|FAIL' "$W/test-$tag.log" | head -4)"; fi; }

# 2a. The long tests (they compile many two-pass variants) beside the bits, with their own cache.
( run_test gpu_backward_features_core4 gpu_backward_features FLASHCORE_BWD_CORE=4 FLASHCORE_CACHE_DIR=/tmp/fcw-cache-t1
  run_test gpu_varlen_backward_core4 gpu_varlen_backward FLASHCORE_BWD_CORE=4 FLASHCORE_CACHE_DIR=/tmp/fcw-cache-t2
) > "$W/tests-bg.txt" 2>&1 &
BG=$!

# 1. Bits.
{
el "inputs"
python3 scripts/bwd-issue40-mkinput.py "$W"                                          # in_d64, in_d128: B 2, S 1000, 4/2 heads
python3 scripts/bwd-writer-mkinput.py "$W/in_l128.safetensors" 1 3000 8 2 128 41   # 47 query tiles × 4 heads per CTA
python3 scripts/bwd-writer-mkinput.py "$W/in_l64.safetensors" 1 3000 8 2 64 42
el "inputs done"
for case in "d128 --causal" "d128 -" "d64 --causal" "d64 -" "l128 --causal" "l128 -" "l64 --causal"; do
  set -- $case; f="$W/in_$1.safetensors"; c=""; [[ $2 == --causal ]] && c=--causal; tag="$1$c"
  for core in 3 4; do
    FLASHCORE_BWD_ONEPASS=1 FLASHCORE_BWD_CORE=$core timeout 60 "$C/flashcore" attn --grad --input "$f" \
      --output "$W/o_${tag}_$core.safetensors" $c > "$W/attn_${tag}_$core.log" 2>&1 \
      || echo "FAIL run $tag core $core: $(tail -1 "$W/attn_${tag}_$core.log")"
  done
  echo "$tag core3 vs core4: $(python3 scripts/bwd-issue40-samebits.py "$W/o_${tag}_3.safetensors" "$W/o_${tag}_4.safetensors")"
done
FLASHCORE_BWD_ONEPASS=1 FLASHCORE_BWD_CORE=4 timeout 60 "$C/flashcore" attn --grad --input "$W/in_l128.safetensors" \
  --output "$W/o_l128_4b.safetensors" > /dev/null 2>&1
echo "l128 core4 run to run: $(python3 scripts/bwd-issue40-samebits.py "$W/o_l128_4.safetensors" "$W/o_l128_4b.safetensors" 2>&1)"
el "bits done"
} 2>&1 | tee "$W/bits.txt"

# 2b. The short tests.
{
run_test gpu_backward_onepass_core4 gpu_backward FLASHCORE_BWD_ONEPASS=1 FLASHCORE_BWD_CORE=4
run_test gpu_backward_core4 gpu_backward FLASHCORE_BWD_CORE=4
run_test gpu_backward_hd_core4 gpu_backward_hd FLASHCORE_BWD_CORE=4
el "waiting for the long tests"
wait $BG; cat "$W/tests-bg.txt"
el "tests done"
} 2>&1 | tee "$W/tests.txt"

# 3. A/B, graph replay, two rounds in opposite orders (nothing else on the GPU now).
{
for round in 1 2; do
  order="3 4"; [[ $round == 2 ]] && order="4 3"
  for shape in "2 16 8192 128 --causal" "2 16 8192 128 -" "4 32 4096 64 --causal" "8 16 2048 128 -"; do
    set -- $shape; c=""; [[ $5 == --causal ]] && c=--causal
    for core in $order; do
      j="$W/r${round}-$1-$2-$3-$4$c-core$core"
      FLASHCORE_BWD_ONEPASS=1 FLASHCORE_BWD_CORE=$core timeout 90 "$C/flashcore" bench --backward --batch $1 --heads $2 \
        --seqlen $3 --headdim $4 $c --dtype bf16 --mode graph --graph-calls 10 --graph-reps 6 --warmup 3 \
        --json "$j.json" > "$j.txt" 2>&1 || echo "FAIL bench r$round $shape core $core: $(tail -1 "$j.txt")"
    done
  done
  el "bench round $round done"
done
python3 - "$W" <<'PY'
import json, glob, os, sys, collections
t = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(sys.argv[1] + '/r[12]-*.json')):
    name = os.path.basename(f)[3:-5]; shape, core = name.rsplit('-core', 1)
    for x in json.load(open(f))["records"]:
        if x.get("status") == "ok" and x.get("mode") == "graph" and x.get("pass") == "backward":
            t[shape][core].append(round(x["time_us"]["median"], 1))
print("backward alone, graph median µs per round (round 1: core 3 first; round 2: core 4 first); ratio of the rounds' minima")
for s in t:
    a, b = t[s].get('3', []), t[s].get('4', [])
    r = f"{min(b) / min(a):.3f}" if a and b else "n/a"
    print(f"{s:24s} core3 {a}  core4 {b}  core4/core3 {r}")
PY
} 2>&1 | tee "$W/bench.txt"
kill $SMI 2>/dev/null

# 4. One profile of core 4, if time is left.
if (( $(date +%s) - T0 < 330 )); then
  el "ncu core 4, 2,16,8192,128 causal"
  FLASHCORE_BWD_ONEPASS=1 FLASHCORE_BWD_CORE=4 timeout 60 ncu --clock-control none --kernel-name flashcore_bwd_onepass \
    --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters \
    -o "$W/prof" -f "$C/flashcore" bench --batch 2 --heads 16 --seqlen 8192 --headdim 128 --causal --dtype bf16 \
    --backward --mode event --reps 1 --warmup 1 > "$W/ncu.log" 2>&1
  timeout 15 ncu -i "$W/prof.ncu-rep" --page details > "$out/ncu-details.txt" 2>&1
  timeout 20 ncu -i "$W/prof.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$out/ncu-source.csv.gz"
  tail -3 "$W/ncu.log"
else
  el "ncu skipped (time)"
fi
el "all done"

cp "$W/bits.txt" "$W/tests.txt" "$W/bench.txt" "$out/"
{ cat "$W/gpu.txt"; echo; echo "== bits"; grep -v '^\[t' "$W/bits.txt"; echo; echo "== tests"; grep -E '^(PASS|FAIL)' "$W/tests.txt"
  echo; echo "== bench"; sed -n '/^backward alone/,$p' "$W/bench.txt"; grep FAIL "$W/bench.txt"
  echo; echo "== clocks (smi samples: min/median/max SM MHz)"
  awk -F', ' 'NR>1 && $2+0>0 {print $2+0}' "$W/smi.csv" | sort -n | awk '{a[NR]=$1} END {if (NR) print a[1], a[int((NR+1)/2)], a[NR], "over", NR, "samples"}'
  echo "elapsed $(( $(date +%s) - T0 )) s"
} > "$out/summary.txt" 2>&1
tar czf "$out/logs.tgz" -C "$W" $(cd "$W" && ls *.json *.txt *.log smi.csv 2>/dev/null)
cat "$out/summary.txt"
