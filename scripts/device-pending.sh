#!/usr/bin/env bash
# One GPU call for what is built but not yet measured — the row-major gather of paged K/V
# (FLASHCORE_GATHER=rows: its GPU tests, then chunked prefill and decode over 1- and 7-row
# pages against the default gather) — and for the decode map the serving work needs next: the
# decode suite side by side (flashcore, cuDNN and FA2 through SDPA, one process), decode's K/V
# L2 promotion A/B (128, the default, against 256) for the H100's record, and ncu of flashcore's
# and cuDNN's decode kernels at 32,32/8,4k,128 and flashcore's at 64,16/16,1k,64 — the shapes
# still 1.09–1.10× SDPA on the H200.
# Build here first (the device takes 64 MiB of carried files):
#   bash scripts/build-carry.sh gpu_bit_pins gpu_kv_chunked gpu_kv_pages
#   python3 -m pip wheel --no-deps ./python -w .carry/wheel
# then run with carry [".carry"]:
#   bash scripts/device-pending.sh [tests|gather|bench|ncu|all]   (default all)
# Logs go to $OUT (the device tool's return folder), else device-out/.
set -uo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
out="${OUT:-device-out}"
mkdir -p "$out"
start=$(date +%s)
elapsed() { echo "$(($(date +%s) - start))"; }
export FLASHCORE_CACHE_DIR=/tmp/flashcore-cache
if [[ -f .carry/manifest_dir ]]; then
    manifest_dir="$(cat .carry/manifest_dir)"
    mkdir -p "$manifest_dir/target/release" && cp .carry/flashcore "$manifest_dir/target/release/flashcore"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
git rev-parse HEAD 2>/dev/null | tee "$out/commit.txt"
if ls .carry/wheel/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-deps --force-reinstall .carry/wheel/*.whl
fi
run_test() {  # run_test NAME [ENV=VALUE ...]
    local name="$1"
    shift
    if env FLASHCORE_REQUIRE_GPU=1 "$@" ".carry/tests/$name" --test-threads=1 >"$out/test-$name.log" 2>&1; then
        echo "PASS $name $*: $(grep -E '^test result' "$out/test-$name.log" | tail -1)"
    else
        echo "FAIL $name $*: $(grep -E '^test result|panicked' "$out/test-$name.log" | head -3)"
    fi
}
if [[ "$what" == all || "$what" == tests ]]; then
    {
        run_test gpu_bit_pins
        run_test gpu_kv_chunked
        run_test gpu_kv_chunked FLASHCORE_GATHER=rows
        run_test gpu_kv_pages FLASHCORE_GATHER=rows
    } | tee "$out/tests.txt"
    FLASHCORE_REQUIRE_GPU=1 python3 -m pytest -q -p no:cacheprovider python/tests/test_gpu_chunked.py 2>&1 | tail -3 \
        | tee "$out/py-chunked.txt"
fi
if [[ "$what" == all || "$what" == gather ]]; then
    for run in pieces:1 rows:1 rows:2 pieces:2; do
        mode="${run%%:*}" round="${run##*:}"
        FLASHCORE_GATHER=$mode timeout 120 python3 bench/chunked_pages.py --out "$out/chunked-$mode-r$round.json" \
            2>&1 | sed "s/^/$mode r$round /" >>"$out/chunked-gather.txt"
        FLASHCORE_GATHER=$mode timeout 120 .carry/tests/gpu_kv_pages --ignored --nocapture page_size_speed \
            2>&1 | sed "s/^/$mode r$round /" >>"$out/decode-gather.txt"
    done
    echo "gather A/B t=$(elapsed)"
fi
if [[ "$what" == all || "$what" == bench ]]; then
    (while true; do
        nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
        sleep 2
    done) >"$out/clocks.csv" &
    clk=$!
    timeout 240 python3 bench/sdpa.py --suite decode --backends cudnn,flash,flashcore-torch --mode graph \
        --graph-reps 10 --warmup 3 --json "$out/decode-sbs.json" >"$out/decode-sbs.txt" 2>&1
    echo "decode side by side rc=$? t=$(elapsed)"
    for run in 256:1 128:1 128:2 256:2; do
        l2="${run%%:*}" round="${run##*:}"
        FLASHCORE_DECODE_KV_L2=$l2 timeout 60 python3 bench/kvcache_pages.py --out "$out/decode-l2-$l2-r$round.json" \
            2>&1 | sed "s/^/l2=$l2 r$round /" >>"$out/decode-l2.txt"
    done
    echo "decode L2 A/B t=$(elapsed)"
    kill "$clk"
fi
if [[ "$what" == all || "$what" == ncu ]]; then
    ncu="/usr/local/cuda/bin/ncu --section LaunchStats --section Occupancy --section SpeedOfLight \
--section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
--metrics dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct"
    timeout 60 $ncu -k regex:flashcore --launch-skip 2 --launch-count 2 .carry/flashcore bench --batch 32 --heads 32 \
        --heads-kv 8 --seqlen 1 --seqlen-k 4096 --headdim 128 --dtype bf16 --mode event --reps 3 --warmup 2 \
        >"$out/ncu-fc-32-4k.txt" 2>&1
    timeout 70 $ncu -k regex:"sdpa|fmha|flash|cudnn|attn" --launch-skip 4 --launch-count 2 \
        python3 bench/cudnn_decode.py 32 32 8 4096 128 >"$out/ncu-cudnn-32-4k.txt" 2>&1
    timeout 50 $ncu -k regex:flashcore --launch-skip 2 --launch-count 1 .carry/flashcore bench --batch 64 --heads 16 \
        --heads-kv 16 --seqlen 1 --seqlen-k 1024 --headdim 64 --dtype bf16 --mode event --reps 3 --warmup 2 \
        >"$out/ncu-fc-64-1k-d64.txt" 2>&1
    echo "ncu t=$(elapsed)"
fi
