#!/usr/bin/env bash
# One call on the GPU machine: every test binary with FLASHCORE_REQUIRE_GPU=1, `flashcore attn`
# against PyTorch SDPA, and the side-by-side seed benchmark. Binaries are built on a CPU machine
# by scripts/build-carry.sh into .carry/ (the device has no Rust).
#   bash scripts/device-check.sh [tests|torch|bench|all]   (default all)
# Logs and results go to $OUT (the device tool's return folder), else device-out/.
set -uo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
out="${OUT:-device-out}"
mkdir -p "$out"
export FLASHCORE_REQUIRE_GPU=1 FLASHCORE_CACHE_DIR=/tmp/flashcore-cache
# Tests that run the CLI find it where cargo built it: recreate that path.
if [[ -f .carry/manifest_dir ]]; then
    manifest_dir="$(cat .carry/manifest_dir)"
    mkdir -p "$manifest_dir/target/release" && cp .carry/flashcore "$manifest_dir/target/release/flashcore"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$out/gpu.txt"
status=0
if [[ "$what" == all || "$what" == tests ]]; then
    for t in .carry/tests/*; do
        name="$(basename "$t")"
        if "$t" --test-threads=1 >"$out/test-$name.log" 2>&1; then
            echo "PASS $name: $(grep -E '^test result' "$out/test-$name.log" | tail -1)"
        else
            echo "FAIL $name: $(grep -E '^test result|panicked' "$out/test-$name.log" | head -3)"
            status=1
        fi
    done | tee "$out/tests.txt"
    grep -q '^FAIL' "$out/tests.txt" && status=1
fi
if [[ "$what" == all || "$what" == torch ]]; then
    python3 scripts/check-attn-vs-torch.py .carry/flashcore /tmp 2>&1 | tee "$out/torch.txt" | tail -30 || status=1
fi
if [[ "$what" == all || "$what" == bench ]]; then
    FLASHCORE_GIT_COMMIT="$(cat .carry/commit 2>/dev/null || true)" BENCH_OUT="$out" \
        bash scripts/bench-vs-sdpa.sh .carry/flashcore ${BENCH_FLAGS:-} 2>&1 | tail -40
fi
exit $status
