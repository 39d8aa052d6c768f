#!/usr/bin/env bash
# One GPU call for the builds that are shipped and audited but not yet run on a GPU, each behind
# its knob: the paged varlen read (FLASHCORE_PAGED_PREFILL=kernel), the 24/240-register backward
# (FLASHCORE_BWD_REGS=240) and decode's K/V L2 promotion (FLASHCORE_DECODE_KV_L2). Their GPU tests
# first, then the timings, each A/B in one process per knob value, two rounds in alternating order.
# Build here first: `bash scripts/build-carry.sh` (binaries and test binaries into .carry/) and a
# wheel into .carry/wheel/ (`python3 -m pip wheel --no-deps ./python -w .carry/wheel`).
#   bash scripts/device-pending.sh [tests|bench|all]   (default all)
# Logs go to $OUT (the device tool's return folder), else device-out/.
set -uo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
out="${OUT:-device-out}"
mkdir -p "$out"
export FLASHCORE_REQUIRE_GPU=1 FLASHCORE_CACHE_DIR=/tmp/flashcore-cache
if [[ -f .carry/manifest_dir ]]; then
    manifest_dir="$(cat .carry/manifest_dir)"
    mkdir -p "$manifest_dir/target/release" && cp .carry/flashcore "$manifest_dir/target/release/flashcore"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
git rev-parse HEAD 2>/dev/null | tee "$out/commit.txt"
run_test() {  # run_test NAME [ENV=VALUE ...]
    local name="$1"
    shift
    if env "$@" ".carry/tests/$name" --test-threads=1 >"$out/test-$name.log" 2>&1; then
        echo "PASS $name $*: $(grep -E '^test result' "$out/test-$name.log" | tail -1)"
    else
        echo "FAIL $name $*: $(grep -E '^test result|panicked' "$out/test-$name.log" | head -3)"
    fi
}
if [[ "$what" == all || "$what" == tests ]]; then
    {
        run_test gpu_kv_chunked FLASHCORE_PAGED_PREFILL=kernel
        run_test gpu_kv_pages
        run_test gpu_varlen
        run_test gpu_bit_pins
        run_test gpu_backward_regs FLASHCORE_BWD_REGS=240
        run_test gpu_decode FLASHCORE_DECODE_KV_L2=128
        run_test gpu_bit_pins FLASHCORE_DECODE_KV_L2=128
    } | tee "$out/tests.txt"
    if ls .carry/wheel/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-deps --force-reinstall .carry/wheel/*.whl
        python3 -m pytest -q -p no:cacheprovider python/tests/test_gpu_chunked.py 2>&1 | tail -5 | tee "$out/py-chunked.txt"
    fi
fi
if [[ "$what" == all || "$what" == bench ]]; then
    python3 bench/chunked_pages.py --out "$out/chunked-pages.json" 2>&1 | tee "$out/chunked-pages.txt"
    # Two rounds, the second in the other order: 256 (the default) then 128, then 128 then 256.
    for run in 256:1 128:1 128:2 256:2; do
        l2="${run%%:*}" round="${run##*:}"
        FLASHCORE_DECODE_KV_L2=$l2 python3 bench/kvcache_pages.py --out "$out/decode-l2-$l2-r$round.json" \
            2>&1 | sed "s/^/l2=$l2 r$round /" | tee -a "$out/decode-l2.txt"
    done
    B="--suite backward --backward --dtype bf16 --headdim 128 --mode graph --warmup 3 --graph-calls 4 --graph-reps 10"
    for run in base:1 240:1 240:2 base:2; do
        regs="${run%%:*}" round="${run##*:}"
        if [[ $regs == 240 ]]; then
            FLASHCORE_BWD_REGS=240 .carry/flashcore bench $B --json "$out/bwd-240-r$round.json" >"$out/bwd-240-r$round.txt" 2>&1
        else
            .carry/flashcore bench $B --json "$out/bwd-base-r$round.json" >"$out/bwd-base-r$round.txt" 2>&1
        fi
    done
fi
