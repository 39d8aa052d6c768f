#!/usr/bin/env bash
# Writes a sorted list of (variant name, SHA-256 of its cubin) for every shipped forward and
# backward kernel variant, each compiled afresh by NVRTC (no GPU, no kernel cache), to stdout or to
# the file named by the first argument. Compare two lists with `diff` to show that a host-side
# change left every kernel byte-identical.
#   bash scripts/cubin-hashes.sh before.txt; ...; bash scripts/cubin-hashes.sh after.txt
#   diff before.txt after.txt
# CUBIN_HASH_THREADS=N compiles N variants at a time (default 1). CUBIN_HASH_OPTIONS=1 lists each
# variant's NVRTC options hash instead, without compiling (seconds, not the ~1 h of 384 compiles). CUBIN_HASH_CACHE=DIR keeps the
# compiled cubins in DIR (a kernel cache keyed by a hash of source, headers and options): a later
# run with the same DIR compiles only the variants whose inputs changed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-cuda-tools.sh >/dev/null
if [ -n "${CUBIN_HASH_CACHE:-}" ]; then
    cache=$CUBIN_HASH_CACHE
    mkdir -p "$cache"
else
    cache=$(mktemp -d)
    trap 'rm -rf "$cache"' EXIT
fi
cargo build --release --quiet --example cubin_hashes
if [ $# -ge 1 ]; then
    FLASHCORE_CACHE_DIR="$cache" target/release/examples/cubin_hashes >"$1"
    echo "cubin-hashes: $(wc -l <"$1") variants written to $1" >&2
else
    FLASHCORE_CACHE_DIR="$cache" target/release/examples/cubin_hashes
fi
