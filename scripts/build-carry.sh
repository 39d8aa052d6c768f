#!/usr/bin/env bash
# Builds the release binary and every test binary here (the GPU machine has no Rust) into .carry/
# (git-ignored), for scripts/device-check.sh to run there. The device takes 64 MiB of carried
# files: with test names as arguments only those test binaries are kept, and every binary is
# stripped (all of them unstripped are ~140 MB).
#   bash scripts/build-carry.sh [TEST_NAME ...]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
rm -rf .carry/tests && mkdir -p .carry/tests
cp target/release/flashcore .carry/flashcore
cargo test --release --no-run --message-format=json 2>/dev/null \
    | python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] != ["bin"]:
        name = m["target"]["name"] + ("-lib" if "lib" in m["target"]["kind"] else "")
        shutil.copy(m["executable"], os.path.join(".carry/tests", name))
'
if [[ $# -gt 0 ]]; then
    for t in .carry/tests/*; do
        keep=0
        for want in "$@"; do [[ "$(basename "$t")" == "$want" ]] && keep=1; done
        [[ $keep == 1 ]] || rm "$t"
    done
fi
strip .carry/flashcore .carry/tests/* 2>/dev/null || true
pwd > .carry/manifest_dir
git rev-parse HEAD > .carry/commit
ls .carry/tests | wc -l
du -sh .carry
