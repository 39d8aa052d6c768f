#!/usr/bin/env bash
# flashcore vs PyTorch SDPA (flash, cuDNN, efficient) and FlashAttention-4 (when `flash_attn.cute`
# imports; scripts/prepare-fa4.sh installs it on a GPU machine without internet), side by side.
#
#   bash scripts/bench-vs-sdpa.sh [FLASHCORE_BIN] [extra flags for both, e.g. --reps 100 --dtype f16]
#
# FLASHCORE_BIN: the first argument if it is not a flag, else $FLASHCORE_BIN, else
# target/release/flashcore, else .carry/flashcore (a binary built elsewhere and carried over).
# SUITE (default seed) picks the suite; extra flags go to both `flashcore bench` and
# bench/sdpa.py (only the flags they share: --reps --warmup --graph-calls --graph-reps --mode
# --dtype --layout --device --seed). Results go to $BENCH_OUT, else $OUT (the device tool's
# return folder), else bench-out/: flashcore.json, sdpa.json, table.txt, vs-sdpa.png.
# The final table is flashcore's joiner: `flashcore bench --from-json flashcore.json --compare sdpa.json`.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=""
if [[ $# -gt 0 && "$1" != -* ]]; then
    bin="$1"
    shift
fi
bin="${bin:-${FLASHCORE_BIN:-}}"
if [[ -z "$bin" ]]; then
    for c in target/release/flashcore .carry/flashcore; do
        if [[ -x "$c" ]]; then bin="$c"; break; fi
    done
fi
if [[ -z "$bin" || ! -x "$bin" ]]; then
    echo "bench-vs-sdpa: no flashcore binary (give it as the first argument or FLASHCORE_BIN)" >&2
    exit 2
fi
suite="${SUITE:-seed}"
out="${BENCH_OUT:-${OUT:-bench-out}}"
mkdir -p "$out"
if [[ -z "${FLASHCORE_GIT_COMMIT:-}" ]]; then
    FLASHCORE_GIT_COMMIT="$(git rev-parse --verify -q HEAD 2>/dev/null || true)"
fi
# Anything but a commit id (e.g. no git history in a copied tree) leaves it to the binary's
# build-time value or null.
export FLASHCORE_GIT_COMMIT

echo "== flashcore ($bin), suite $suite" >&2
"$bin" bench --suite "$suite" --json "$out/flashcore.json" "$@" >"$out/flashcore.txt" || true
echo "== PyTorch SDPA, suite $suite" >&2
python3 bench/sdpa.py --suite "$suite" --json "$out/sdpa.json" "$@" >"$out/sdpa.txt" || true

files=()
[[ -s "$out/flashcore.json" ]] && files+=(--from-json "$out/flashcore.json")
[[ -s "$out/sdpa.json" ]] && files+=(--compare "$out/sdpa.json")
if [[ ${#files[@]} -eq 0 ]]; then
    echo "bench-vs-sdpa: neither side produced records (see $out/*.txt)" >&2
    cat "$out"/*.txt >&2 || true
    exit 1
fi
if [[ ! -s "$out/flashcore.json" ]]; then
    # Only SDPA ran: show its own table.
    cat "$out/sdpa.txt"
    exit 1
fi
"$bin" bench "${files[@]}" --plot "$out/vs-sdpa.png" | tee "$out/table.txt"
